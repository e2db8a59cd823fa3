package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
)

// pluginEnv makes this test binary serve the benchmark's go-plugin
// counter instead of running tests.
const pluginEnv = "ITERON_GATEWAY_BENCH_PLUGIN"

// pluginHandshake is the go-plugin handshake of the benchmark's plugin.
var pluginHandshake = plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "ITERON_BENCH_PLUGIN", MagicCookieValue: "counter"}

// counterPlugin is the go-plugin peer of the benchmark: a plugin
// subprocess serving the gateway's Invoke over go-plugin's gRPC transport,
// doing what the counter provider does (count a key, answer with the
// terminal observation), so that the benchmark compares transports.
type counterPlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (counterPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	gatewayv1.RegisterGatewayServer(s, &pluginCounter{counts: map[string]int64{}})
	return nil
}

func (counterPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return gatewayv1.NewGatewayClient(c), nil
}

// pluginCounter is the plugin side: an in-process counter.
type pluginCounter struct {
	gatewayv1.UnimplementedGatewayServer
	mu     sync.Mutex
	counts map[string]int64
	total  int64
}

func (p *pluginCounter) Invoke(_ context.Context, req *gatewayv1.InvokeRequest) (*gatewayv1.InvokeResponse, error) {
	var in struct {
		Key string `json:"key"`
		Add int64  `json:"add"`
	}
	if err := json.Unmarshal([]byte(req.InputJson), &in); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.counts[in.Key] += in.Add
	p.total += in.Add
	count, total := p.counts[in.Key], p.total
	p.mu.Unlock()
	obs := fmt.Sprintf(`{"implementation_version":"2.0.0","key":%q,"count":%d,"total":%d}`, in.Key, count, total)
	return &gatewayv1.InvokeResponse{InvocationId: req.InvocationId, Generation: 1, ObservationJson: obs}, nil
}

// servePlugin is the body of the plugin subprocess.
func servePlugin() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: pluginHandshake,
		Plugins:         plugin.PluginSet{"counter": counterPlugin{}},
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          hclog.NewNullLogger(),
	})
}

// startPlugin starts this test binary as the go-plugin counter and returns
// its client.
func startPlugin(tb testing.TB) gatewayv1.GatewayClient {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), pluginEnv+"=1")
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  pluginHandshake,
		Plugins:          plugin.PluginSet{"counter": counterPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	tb.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		tb.Fatalf("start the go-plugin counter: %v", err)
	}
	raw, err := rpc.Dispense("counter")
	if err != nil {
		tb.Fatal(err)
	}
	return raw.(gatewayv1.GatewayClient)
}
