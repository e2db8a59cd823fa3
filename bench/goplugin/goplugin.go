// Package goplugin is the comparison peer of the executor's benchmarks: the
// same echo call ("start" a run whose terminal observation is its input)
// served through github.com/hashicorp/go-plugin v1.8.0 with its gRPC
// transport. The service is declared by hand (a grpc.ServiceDesc over
// wrapperspb.BytesValue), so no generated code is needed; the payload
// travels as protobuf bytes, which is what a go-plugin user forwarding JSON
// would send.
package goplugin

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Handshake is shared by the plugin and its host.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "ITERON_BENCH_PLUGIN",
	MagicCookieValue: "echo",
}

// PluginName is the name the plugin is dispensed by.
const PluginName = "echo"

// Echo is the service: Start returns its input.
type Echo interface {
	Start(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)
}

// serviceDesc declares the one-method gRPC service by hand.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "iteron.bench.Echo",
	HandlerType: (*Echo)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Start",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(Echo).Start(ctx, in)
		},
	}},
	Streams: []grpc.StreamDesc{},
}

// Plugin is the go-plugin GRPCPlugin of the echo service.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl serves the calls (plugin side only).
	Impl Echo
}

// GRPCServer registers the service.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&serviceDesc, p.Impl)
	return nil
}

// GRPCClient returns a client of the service.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{conn: c}, nil
}

// Client calls the plugin.
type Client struct{ conn *grpc.ClientConn }

// Start sends payload and returns the echo.
func (c *Client) Start(ctx context.Context, payload []byte) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	if err := c.conn.Invoke(ctx, "/iteron.bench.Echo/Start", wrapperspb.Bytes(payload), out); err != nil {
		return nil, err
	}
	return out.Value, nil
}
