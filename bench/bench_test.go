package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"iteron.dev/operator/bench/goplugin"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/verifier"
)

func TestMain(m *testing.M) { providertest.Main(m) }

// payload returns a JSON document of exactly n bytes shaped like a real
// input: an array of records with ids, short strings and numbers, then a
// padding string to the exact size.
func payload(n int) jsontext.Value {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"id":%d,"role":"user","text":"lorem ipsum dolor sit amet, consectetur adipiscing elit","score":%d.25},`, i, i%97)
		if b.Len()+len(item)+len(`],"pad":""}`)+1 > n {
			break
		}
		b.WriteString(item)
	}
	s := strings.TrimSuffix(b.String(), ",")
	s += `],"pad":"`
	s += strings.Repeat("p", n-len(s)-len(`"}`))
	s += `"}`
	if len(s) != n || !jsontext.Value(s).IsValid() {
		panic(fmt.Sprintf("payload of %d bytes, want %d", len(s), n))
	}
	return jsontext.Value(s)
}

func buildInto(b *testing.B, pkg, name string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := artifacts.ModuleRoot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(providertest.Dir(b), name)
	if err := artifacts.Build(ctx, root, pkg, out, ""); err != nil {
		b.Fatal(err)
	}
	return out
}

func median(s []time.Duration) time.Duration {
	s = slices.Clone(s)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkStartToTerminal measures one run, from start to its terminal
// observation, through the executor (a protocol-1 echo provider written with
// pkg/provider: the input is validated on the way in and the observation on
// the way out, and neither is decoded into maps and re-encoded) against the
// same call through go-plugin v1.8.0 over gRPC, interleaved in the same
// iterations. It reports the medians and their ratio.
func BenchmarkStartToTerminal(b *testing.B) {
	echo := buildInto(b, "iteron.dev/operator/bench/echo", "echo")

	ex, err := procexec.NewExecutor(procexec.DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	impl := providertest.Implement(b, artifacts.Spec{Binary: echo, ImplementationID: "echo", Protocol: 1, Version: [3]uint64{1, 0, 0}})
	plan := providertest.Plan(b, impl, func(f *verifier.LaunchPlanFields) { f.RuntimeDeadline = time.Hour })
	ctx := context.Background()
	var p *procexec.Process
	launch := func() {
		if p != nil {
			p.Close()
		}
		if p, err = ex.Launch(plan); err != nil {
			b.Fatal(err)
		}
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
	}
	launch()
	defer func() { p.Close() }()

	gp := startGoPlugin(b)

	interleaved(b, gp, func(n int) bool { return p.Budget().StdinBytes < int64(n)+4096 }, launch, func(i int, in jsontext.Value) ([]byte, error) {
		run, err := p.Start(ctx, "run-"+strconv.Itoa(i), in, 10*time.Second)
		if err != nil {
			return nil, err
		}
		o, err := run.Result()
		return o.Observation, err
	})
}

// interleaved runs, for each payload size, our echo call (ours) and the
// go-plugin echo call one after the other in every iteration, so that both
// see the same machine load, and reports each one's median and their
// ratio. When full says an n-byte input no longer fits our process, renew
// replaces it outside the timed region, as the coordinator does before the
// bound.
func interleaved(b *testing.B, gp *goplugin.Client, full func(n int) bool, renew func(), ours func(i int, in jsontext.Value) ([]byte, error)) {
	ctx := context.Background()
	for _, size := range payloadSizes {
		in := payload(size.n)
		b.Run(size.name, func(b *testing.B) {
			var mine, theirs []time.Duration
			for i := 0; i < b.N; i++ {
				if full(len(in)) {
					b.StopTimer()
					renew()
					b.StartTimer()
				}
				t0 := time.Now()
				out, err := ours(i, in)
				mine = append(mine, time.Since(t0))
				if err != nil || !bytes.Equal(out, in) {
					b.Fatalf("echo: %d bytes, %v", len(out), err)
				}
				t0 = time.Now()
				out, err = gp.Start(ctx, in)
				theirs = append(theirs, time.Since(t0))
				if err != nil || !bytes.Equal(out, in) {
					b.Fatalf("go-plugin echo: %d bytes, %v", len(out), err)
				}
			}
			mo, mt := median(mine), median(theirs)
			b.ReportMetric(float64(mo)/1e3, "ours-p50-µs")
			b.ReportMetric(float64(mt)/1e3, "goplugin-p50-µs")
			b.ReportMetric(float64(mo)/float64(mt), "ratio")
		})
	}
}

// payloadSizes are the input sizes of the start → terminal benchmarks.
var payloadSizes = []struct {
	name string
	n    int
}{{"200B", 200}, {"64KiB", 64 << 10}, {"500KiB", 500 << 10}}

// startGoPlugin starts the go-plugin echo plugin (the baseline) and returns
// its client; the plugin is killed when b's benchmark ends.
func startGoPlugin(b *testing.B) *goplugin.Client {
	pluginExe := buildInto(b, "iteron.dev/operator/bench/goplugin/plugin", "goplugin-echo")
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  goplugin.Handshake,
		Plugins:          map[string]plugin.Plugin{goplugin.PluginName: &goplugin.Plugin{}},
		Cmd:              exec.Command(pluginExe),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Off}),
	})
	b.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		b.Fatal(err)
	}
	raw, err := rpc.Dispense(goplugin.PluginName)
	if err != nil {
		b.Fatal(err)
	}
	return raw.(*goplugin.Client)
}
