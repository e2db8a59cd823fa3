package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

// defaultGatewaySocket is the manager's default --gateway-socket.
const defaultGatewaySocket = "/run/iteron/gateway.sock"

func newInvokeCmd() *cobra.Command {
	var (
		socket, namespace, activation, module, input, invocationID string
		export, objectID, sessionID                                string
		pin                                                        int64
		watch, traced                                              bool
		timeout                                                    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "invoke --activation NAME --module MODULE [--input JSON|-]",
		Short: "Call a module through this node's gateway and print its terminal observation",
		Long: `invoke runs one call on the active generation of a module through the node-local
gateway (a unix socket; the caller's uid/gid must be allowed for the namespace by
the manager's --gateway-allow) and prints the terminal observation as one line of
JSON. With --watch it prints every observation of the run, one JSON per line, the
terminal one last. A call made during a hot swap waits and runs on the new
generation. --invocation-id makes the call idempotent: sending it again returns
the first outcome and never runs it twice.

A module served by a package runtime takes --export (one of its export IDs;
default its only one), --object-id and --session-id; invoke prints the runtime's
result value as JSON, and fails (exit 1) when the runtime answers ok=false. With
--watch it prints each event's value as it comes, the runtime's initial event
first, and again after the module's runtime was replaced (the watch moves).

The call carries the caller's W3C trace context when there is one: invoke's own
span when the OTEL_* variables configure tracing, else TRACEPARENT from the
environment; --trace starts a sampled trace when neither does, and prints its
trace_id on stderr.

Exit status: 0 the call completed, 1 it failed (the reason on stderr, e.g.
"stale_generation: …"), 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (callErr error) {
			switch {
			case activation == "":
				return usage(errors.New("--activation is required"))
			case module == "":
				return usage(errors.New("--module is required"))
			case protocol.ValidModule(module) != nil:
				return usage(fmt.Errorf("--module %q: %v", module, protocol.ValidModule(module)))
			case !gateway.IsNamespaceName(namespace):
				return usage(fmt.Errorf("--namespace %q is not a namespace name", namespace))
			case timeout <= 0 || timeout > gateway.MaxCallDeadline:
				return usage(fmt.Errorf("--timeout %v must be in (0, %v]", timeout, gateway.MaxCallDeadline))
			case cmd.Flags().Changed("pin-generation") && pin <= 0:
				return usage(fmt.Errorf("--pin-generation %d: a generation is at least 1", pin))
			case invocationID != "" && protocol.ValidID(invocationID) != nil:
				return usage(fmt.Errorf("--invocation-id %q: %v", invocationID, protocol.ValidID(invocationID)))
			case export != "" && protocol.ValidID(export) != nil:
				return usage(fmt.Errorf("--export %q: %v", export, protocol.ValidID(export)))
			}
			body := []byte(input)
			if input == "-" {
				var err error
				if body, err = strictjson.ReadBounded(cmd.InOrStdin(), protocol.MaxPayloadBytes); err != nil {
					return usage(fmt.Errorf("--input - (stdin): %w", err))
				}
			}
			if err := strictjson.Valid(body, protocol.MaxPayloadBytes); err != nil {
				return usage(fmt.Errorf("--input: %w", err))
			}
			client, err := gateway.Dial(socket)
			if err != nil {
				return usage(err)
			}
			defer client.Close()
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			// The gateway enforces the timeout itself (deadline_ms) and says
			// so with its reason; the gRPC deadline, a little later, only
			// guards against a gateway that does not answer.
			ctx, cancel := context.WithTimeout(ctx, timeout+2*time.Second)
			defer cancel()
			tr, err := startInvokeTrace(ctx, traced, cmd.ErrOrStderr())
			if err != nil {
				return usage(err)
			}
			ctx = tr.ctx
			defer func() { tr.end(callErr) }()
			var pinned *int64
			if cmd.Flags().Changed("pin-generation") {
				pinned = &pin
			}
			out := cmd.OutOrStdout()
			if watch {
				return watchCall(ctx, client, out, &gatewayv1.WatchRequest{
					Namespace: namespace, Activation: activation, Module: module, InvocationId: invocationID,
					InputJson: string(body), DeadlineMs: uint64(timeout.Milliseconds()), PinnedGeneration: pinned,
					Export: export, ObjectId: objectID, SessionId: sessionID,
				})
			}
			resp, err := client.Invoke(ctx, &gatewayv1.InvokeRequest{
				Namespace: namespace, Activation: activation, Module: module, InvocationId: invocationID,
				InputJson: string(body), DeadlineMs: uint64(timeout.Milliseconds()), PinnedGeneration: pinned,
				Export: export, ObjectId: objectID, SessionId: sessionID,
			})
			if err != nil {
				return callFailed(err)
			}
			if _, err := fmt.Fprintln(out, resp.ObservationJson); err != nil {
				return err
			}
			if resp.ValueJson != "" && !resp.Ok {
				// A package runtime's own failure of the call.
				return invalid(fmt.Errorf("the runtime answered ok=false: %s", resp.Error))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", defaultGatewaySocket, "the gateway's unix socket (the manager's --gateway-socket)")
	f.StringVarP(&namespace, "namespace", "n", "default", "namespace of the ImplementationActivation")
	f.StringVar(&activation, "activation", "", "name of the ImplementationActivation")
	f.StringVar(&module, "module", "", "module to call (snake_case, e.g. prompt_system)")
	f.StringVar(&input, "input", "{}", "the run's input: one JSON value, or - to read it from stdin (at most 512 KiB)")
	f.StringVar(&invocationID, "invocation-id", "", "an ID of your choice that makes the call idempotent")
	f.Int64Var(&pin, "pin-generation", 0, "run only on this generation; fails with stale_generation after a cutover")
	f.BoolVar(&watch, "watch", false, "print every observation of the run, one JSON per line")
	f.BoolVar(&traced, "trace", false, "have the node trace this call: send a sampled W3C trace context (a new trace unless TRACEPARENT or the OTEL_* variables give one) and print its trace_id on stderr")
	f.StringVar(&export, "export", "", "package runtimes: the export to call (default: the runtime's only export)")
	f.StringVar(&objectID, "object-id", "", "package runtimes: the object the call is about")
	f.StringVar(&sessionID, "session-id", "", "package runtimes: the caller's session")
	f.DurationVar(&timeout, "timeout", gateway.DefaultCallDeadline, "the call's whole budget, waiting included (becomes the run's deadline_ms)")
	return cmd
}

func watchCall(ctx context.Context, client *gateway.Client, out io.Writer, req *gatewayv1.WatchRequest) error {
	stream, err := client.Watch(ctx, req)
	if err != nil {
		return callFailed(err)
	}
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return callFailed(err)
		}
		if _, err := fmt.Fprintln(out, ev.ObservationJson); err != nil {
			return err
		}
		if ev.Error != "" {
			// A package runtime ended the watch with an error.
			return invalid(fmt.Errorf("the runtime ended the watch: %s", ev.Error))
		}
	}
}

// callFailed reports a failed call (exit 1): the gateway's
// "<reason>: <message>" and the gRPC code.
func callFailed(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return invalid(err)
	}
	return invalid(fmt.Errorf("%s (gRPC %s)", st.Message(), st.Code()))
}
