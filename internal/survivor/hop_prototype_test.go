package survivor

// A prototype of the extra hop (docs/survivor.md): the provider is owned by
// a second process (this test binary re-run as a relay), which keeps its
// procexec.Process and relays whole runs over a unix socket; the caller
// sends one length-prefixed request and reads one reply per call. Measured
// against the direct path (the same provider driven by procexec in this
// process) in the same run.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/activation"
	"iteron.dev/operator/internal/procexec"
)

func TestMain(m *testing.M) { providertest.Main(m) }

func TestHopRelay(t *testing.T) {
	sock := os.Getenv("HOP_RELAY_SOCKET")
	if sock == "" {
		t.Skip("relay process only")
	}
	var f activation.LaunchPlanFields
	if err := json.Unmarshal([]byte(os.Getenv("HOP_RELAY_PLAN")), &f); err != nil {
		t.Fatal(err)
	}
	ex, err := procexec.NewExecutor(procexec.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	plan := activation.NewLaunchPlanForTest(t, f)
	launch := func() *procexec.Process {
		p, err := ex.Launch(plan)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := launch()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	r, w := bufio.NewReader(conn), bufio.NewWriter(conn)
	var hdr [4]byte
	buf := make([]byte, 0, 4096)
	for i := 0; ; i++ {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		if p.Budget().StdinBytes < 64<<10 {
			p.Close()
			p = launch()
		}
		run, err := p.Start(context.Background(), fmt.Sprintf("run-%d", i), jsontext.Value(buf), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		obs, err := run.Result()
		if err != nil {
			t.Fatal(err)
		}
		binary.BigEndian.PutUint32(hdr[:], uint32(len(obs.Observation)))
		w.Write(hdr[:])
		w.Write(obs.Observation)
		w.Flush()
	}
}

func BenchmarkHopPrototype(b *testing.B) {
	impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.CounterV2})
	fields := providertest.Fields(b, impl)
	plan := activation.NewLaunchPlanForTest(b, fields)
	input := []byte(`{"key":"bench","add":1}`)
	var direct, relayed float64
	b.Run("direct", func(b *testing.B) {
		ex, err := procexec.NewExecutor(procexec.DefaultConfig(b.TempDir()))
		if err != nil {
			b.Fatal(err)
		}
		launch := func() *procexec.Process {
			p, err := ex.Launch(plan)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := p.Load(context.Background()); err != nil {
				b.Fatal(err)
			}
			return p
		}
		p := launch()
		defer func() { p.Close() }()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if p.Budget().StdinBytes < 64<<10 {
				b.StopTimer()
				p.Close()
				p = launch()
				b.StartTimer()
			}
			run, err := p.Start(context.Background(), fmt.Sprintf("run-%d", i), jsontext.Value(input), 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := run.Result(); err != nil {
				b.Fatal(err)
			}
		}
		direct = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("relayed", func(b *testing.B) {
		dir, _ := os.MkdirTemp("", "hop")
		defer os.RemoveAll(dir)
		sock := filepath.Join(dir, "s")
		pj, _ := json.Marshal(fields)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHopRelay$")
		cmd.Env = append(os.Environ(), "HOP_RELAY_SOCKET="+sock, "HOP_RELAY_PLAN="+string(pj))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		var conn net.Conn
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			c, err := net.Dial("unix", sock)
			if err == nil {
				conn = c
				break
			}
			if time.Since(start) > 20*time.Second {
				b.Fatal(err)
			}
		}
		r, w := bufio.NewReader(conn), bufio.NewWriter(conn)
		var hdr [4]byte
		out := make([]byte, 4096)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			binary.BigEndian.PutUint32(hdr[:], uint32(len(input)))
			w.Write(hdr[:])
			w.Write(input)
			w.Flush()
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(r, out[:binary.BigEndian.Uint32(hdr[:])]); err != nil {
				b.Fatal(err)
			}
		}
		relayed = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	if direct > 0 && relayed > 0 {
		b.Logf("direct %.1f µs/call, relayed %.1f µs/call, ratio %.2f, extra %.1f µs", direct/1e3, relayed/1e3, relayed/direct, (relayed-direct)/1e3)
	}
}
