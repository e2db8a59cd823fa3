package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/spf13/cobra"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/procexec/conformance"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

func newConformanceCmd() *cobra.Command {
	var (
		protocolVersion int
		module, implID  string
		timeout         time.Duration
		input           string
		cancelInput     string
		uid, gid        int
		interpreters    []string
		stderrBytes     int64
		trace           bool
		kind            string
		pr              packageRuntimeFlags
		sandboxFlags    sandbox.Flags
		capabilities    string
	)
	cmd := &cobra.Command{
		Use:   "conformance <executable> --protocol 1|2 --module <module> [-- argv...] | --kind package-runtime <manifest.json>",
		Short: "Run a provider executable through the whole protocol and report each violation",
		Long: `conformance hashes the executable itself and runs it exactly as the executor runs a
verified provider (sealed copy, no shell, empty environment, own process group,
provider uid/gid, NoNewPrivs, no capabilities), then drives it: load; start with
--input and observe to the terminal observation; start a second run (with
--cancel-input) and cancel it; for protocol 2 snapshot, migrate, restore and
readiness; then stop. Each violation is reported with its operation and the offending frame. With
--trace every frame exchanged is printed as it crosses the pipe: "> " and the
line the host wrote to the provider's stdin, "< " and a line the provider
wrote to its stdout (docs/reference/protocol.md describes each).

With --kind package-runtime the argument is a package runtime's manifest
(docs/reference/package-runtimes.md): the runtime is launched as the manager
launches one (the manifest's digest checked on a sealed copy, descriptors 3-5,
uid/gid, empty environment), its handshake checked field by field, then every
export is invoked (with --invoke EXPORT=JSON, or {}) and its status asked,
each export named by --watch EXPORT=JSON is watched to its first event and
cancelled, and the status of an invocation it never saw is asked. Each
violation is printed with the runtime's offending message.

The provider runs in the sandbox a node gives it (--sandbox=enforce by default,
as the manager): its capabilities (--capabilities for a provider, the
manifest's requested capabilities within --capability-ceiling for a package
runtime) become the kernel rules of docs/security.md, and the sandbox applied is
printed. A provider that needs more than it declares fails here as it would on
a node. Run as root for the full sandbox; without root the launcher uses a user
namespace and the memory, CPU and task bounds are unavailable (said so). The
launcher, iteron-sandbox, is looked for beside kubectl-iteron, then on PATH
(--sandbox-launcher); --sandbox=off runs the provider as before the sandbox.

Exit status: 0 conformant, 1 violations found, 2 usage.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch kind {
			case "provider":
			case "package-runtime":
				return runPackageRuntimeConformance(cmd, args, pr, uid, gid, interpreters, &sandboxFlags)
			default:
				return usage(fmt.Errorf("--kind must be provider or package-runtime, not %q", kind))
			}
			dash := cmd.ArgsLenAtDash()
			var argv []string
			switch {
			case dash == 0:
				return usage(errors.New("the executable comes before --"))
			case dash > 0:
				if dash != 1 {
					return usage(fmt.Errorf("one executable expected before --, got %q", args[:dash]))
				}
				argv = args[dash:]
			case len(args) != 1:
				return usage(fmt.Errorf("one executable expected, got %q (put its arguments after --)", args))
			}
			if protocolVersion != 1 && protocolVersion != 2 {
				return usage(fmt.Errorf("--protocol must be 1 or 2, not %d", protocolVersion))
			}
			if module == "" {
				return usage(errors.New("--module is required"))
			}
			if err := protocol.ValidModule(module); err != nil {
				return usage(fmt.Errorf("--module: %v", err))
			}
			if timeout <= 0 {
				return usage(fmt.Errorf("--timeout must be positive"))
			}
			in := jsontext.Value(input)
			if err := protocol.ValidPayload(in, protocol.MaxPayloadBytes); err != nil {
				return usage(fmt.Errorf("--input: %v", err))
			}
			cancelIn := in
			if cmd.Flags().Changed("cancel-input") {
				cancelIn = jsontext.Value(cancelInput)
				if err := protocol.ValidPayload(cancelIn, protocol.MaxPayloadBytes); err != nil {
					return usage(fmt.Errorf("--cancel-input: %v", err))
				}
			}
			if uid < 0 || gid < 0 {
				return usage(errors.New("--uid and --gid must be non-negative"))
			}
			exe, err := filepath.Abs(args[0])
			if err != nil {
				return usage(err)
			}
			if resolved, err := filepath.EvalSymlinks(exe); err == nil {
				exe = resolved
			}
			digest, err := hashFile(exe)
			if err != nil {
				return usage(fmt.Errorf("executable: %w", err))
			}
			admitted, err := catalog.ParseCeiling(capabilities)
			if err != nil {
				return usage(fmt.Errorf("--capabilities: %v", err))
			}
			plan, err := verifier.PlanForConformance(verifier.ConformanceTarget{
				Module: module, ImplementationID: implID, ProtocolVersion: protocolVersion,
				Executable: exe, ArtifactSHA256: digest, Argv: argv, Admitted: admitted,
				RuntimeDeadline: max(20*timeout, time.Minute), CancellationDeadline: timeout,
				EvidenceLimits: verifier.EvidenceLimits{StdoutBytes: 4 << 20, StderrBytes: stderrBytes, Observations: 4096},
			})
			if err != nil {
				return usage(err)
			}
			records, err := os.MkdirTemp("", "iteron-conformance-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(records)
			out := cmd.OutOrStdout()
			cfg := procexec.DefaultConfig(records)
			cfg.ProviderUID, cfg.ProviderGID = uint32(uid), uint32(gid)
			cfg.Interpreters = interpreters
			if trace {
				var mu sync.Mutex
				cfg.Trace = func(toProvider bool, frame []byte) {
					dir := "< "
					if toProvider {
						dir = "> "
					}
					mu.Lock()
					defer mu.Unlock()
					fmt.Fprintf(out, "%s%s\n", dir, frame)
				}
			}
			sb, err := conformanceSandbox(&sandboxFlags, records)
			if err != nil {
				return err
			}
			defer sb.Close()
			cfg.Sandbox = sb
			ex, err := procexec.NewExecutor(cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "conformance of %s (protocol %d, module %s, %s, uid %d gid %d, capabilities %v)\n", exe, protocolVersion, module, digest, uid, gid, admitted)
			printCapacity(out, sb)
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			rep := conformance.Run(ctx, ex, plan, conformance.Options{Timeout: timeout, Input: in, CancelInput: cancelIn})
			printReport(out, rep)
			if !rep.Conformant() {
				return invalid(fmt.Errorf("%d violation(s)", len(rep.Violations)))
			}
			return nil
		},
	}
	defUID, defGID := procexec.DefaultProviderID, procexec.DefaultProviderID
	if os.Geteuid() != 0 {
		// Only root can run a provider as another uid.
		defUID, defGID = os.Geteuid(), os.Getegid()
	}
	f := cmd.Flags()
	f.IntVar(&protocolVersion, "protocol", 0, "protocol version the provider speaks: 1 or 2 (required)")
	f.StringVar(&module, "module", "", "module to drive the provider as, e.g. prompt_system (required)")
	f.StringVar(&implID, "implementation-id", "conformance", "implementation ID the requests carry")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "bound of each operation and run")
	f.StringVar(&input, "input", "{}", "JSON input of the observed run (and of the cancelled one, without --cancel-input)")
	f.StringVar(&cancelInput, "cancel-input", "", "JSON input of the run that is cancelled (default: --input); a slow run shows how the provider honours cancel")
	f.IntVar(&uid, "uid", defUID, "uid to run the provider as")
	f.IntVar(&gid, "gid", defGID, "gid to run the provider as")
	f.StringSliceVar(&interpreters, "interpreters", []string{"/bin/sh"}, "interpreters a #! script may name")
	f.Int64Var(&stderrBytes, "stderr-bytes", 64<<10, "stderr the provider may write (evidence_limits.stderr_bytes); more is a violation")
	f.BoolVar(&trace, "trace", false, "print every frame exchanged: '> ' host to provider, '< ' provider to host")
	f.StringVar(&kind, "kind", "provider", "provider (the line protocol) or package-runtime (quixos.runtime.PackageRuntime)")
	f.StringVar(&pr.artifactRoot, "artifact-root", "", "package-runtime: the artifact root the manifest's executable is under (default: the manifest's directory)")
	f.StringArrayVar(&pr.invoke, "invoke", nil, "package-runtime: EXPORT=JSON, the input object to invoke EXPORT with (default {}); repeatable")
	f.StringArrayVar(&pr.watch, "watch", nil, "package-runtime: EXPORT=JSON, an export to watch to its first event and cancel; repeatable")
	f.StringVar(&pr.ceiling, "capability-ceiling", "read_only,reversible_local", "package-runtime: the capabilities admitted at most (as the manager's flag)")
	f.StringVar(&pr.namespace, "namespace", "conformance", "package-runtime: the caller namespace the grants name")
	f.StringVar(&capabilities, "capabilities", "", "provider: comma-separated capabilities to run it as admitted (what its sandbox allows: docs/security.md); none by default")
	goFlags := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	sandboxFlags.Register(goFlags, sandbox.ModeEnforce)
	f.AddGoFlagSet(goFlags)
	return cmd
}

// conformanceSandbox is the sandbox of a conformance run, as the flags
// say; its scratch directories go under dir.
func conformanceSandbox(f *sandbox.Flags, dir string) (*sandbox.Sandbox, error) {
	policy, launcher, err := f.Parsed()
	if err != nil {
		return nil, usage(err)
	}
	return sandbox.New(sandbox.Config{Policy: policy, Launcher: launcher, ScratchDir: filepath.Join(dir, "scratch")})
}

// printCapacity says what the sandbox applies here, and why not more.
func printCapacity(out io.Writer, sb *sandbox.Sandbox) {
	c := sb.Capacity()
	fmt.Fprintf(out, "sandbox: mode %s, level %s, cgroups %s, landlock %s", c.Mode, c.Level, c.Cgroups, landlockName(c.Landlock))
	if c.Rootless {
		fmt.Fprint(out, ", rootless (a user namespace: no bounds, and memfds it writes stay executable)")
	}
	if c.CgroupsWhy != "" {
		fmt.Fprintf(out, "; no bounds: %s", c.CgroupsWhy)
	}
	fmt.Fprintln(out)
}

func landlockName(abi int) string {
	if abi == 0 {
		return "unavailable"
	}
	return fmt.Sprintf("ABI %d", abi)
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, io.LimitReader(f, procexec.MaxExecutableBytes+1), make([]byte, 64<<10)); err != nil {
		return "", err
	}
	return strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

func printReport(w io.Writer, rep *conformance.Report) {
	if rep.Sandbox != "" {
		fmt.Fprintf(w, "  sandbox applied: %s\n", rep.Sandbox)
	}
	for _, s := range rep.Steps {
		status := "ok  "
		if !s.OK {
			status = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %-10s %8s  %s\n", status, s.Op, s.Duration.Round(10*time.Microsecond), s.Detail)
	}
	for _, v := range rep.Violations {
		fmt.Fprintf(w, "  violation during %s: %s: %s\n", v.Op, v.Kind, v.Detail)
		if len(v.Frame) > 0 {
			fmt.Fprintf(w, "    frame: %s\n", v.Frame)
		}
	}
	fmt.Fprintf(w, "  provider %s\n", rep.Exit)
	if rep.Conformant() {
		fmt.Fprintf(w, "conformant: %d operations passed\n", len(rep.Steps))
	} else {
		fmt.Fprintf(w, "not conformant: %d violation(s)\n", len(rep.Violations))
	}
}
