package pkgruntime

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	caminopb "iteron.dev/operator/api/quixos/camino"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/test/pkgruntimetest"
)

// BenchmarkInvoke: the host's Invoke (context and grant filled, deadline,
// invocation bound, error mapping) against a bare grpc-go call of the same
// request to the same kv runtime over the same kind of unix socket, each
// iteration one of each; reports the medians and host ÷ direct.
func BenchmarkInvoke(b *testing.B) {
	proc := pkgruntimetest.Start(b, binaries[pkgruntimetest.KV])
	pin := pinFor(pkgruntimetest.KV)
	conn, err := Dial(context.Background(), proc.Socket, proc.Key, pin, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	cc, err := grpc.NewClient("unix://"+proc.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	direct := runtimepb.NewPackageRuntimeClient(cc)
	ctx := context.Background()
	value := make([]byte, 0, 200)
	for len(value) < 150 {
		value = append(value, "abcdefghij"...)
	}
	call := kvCall("put", "k", str(string(value)))
	var host, bare []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		resp, _, err := conn.Invoke(ctx, call)
		host = append(host, time.Since(t0))
		if err != nil || !resp.GetOk() {
			b.Fatal(resp, err)
		}
		id := "direct-" + strconv.Itoa(i)
		t0 = time.Now()
		resp, err = direct.Invoke(ctx, &runtimepb.InvokeRequest{
			InvocationId: id, Export: &quixospb.PackageExportRef{PackageRevisionId: pin.Manifest.PackageRevisionID, ExportId: "put"},
			Input: call.Input, Context: &runtimepb.InvocationContext{InstanceId: conn.InstanceID(), Grant: Grant(proc.Key, id, "team-a", "put")},
		})
		bare = append(bare, time.Since(t0))
		if err != nil || !resp.GetOk() {
			b.Fatal(resp, err)
		}
	}
	mh, md := pkgruntimetest.Median(host), pkgruntimetest.Median(bare)
	b.ReportMetric(float64(mh)/1e3, "host-p50-µs")
	b.ReportMetric(float64(md)/1e3, "direct-p50-µs")
	b.ReportMetric(float64(mh)/float64(md), "ratio")
}

// BenchmarkWatchEvents: events per second a fast reader gets from a
// flooding watch, alone and while a second watch on the same runtime
// connection is read slowly (1 ms per event); reports both rates and
// shared ÷ alone (1.0: the slow reader costs the fast one nothing).
func BenchmarkWatchEvents(b *testing.B) {
	proc := pkgruntimetest.Start(b, binaries[pkgruntimetest.Seed], "-fault=flood-watch")
	conn, err := Dial(context.Background(), proc.Socket, proc.Key, pinFor(pkgruntimetest.Seed), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	const events = 20000
	rate := func() float64 {
		w, err := conn.Watch(ctx, Call{Export: "watch", Input: map[string]*caminopb.Value{"key": str("k")}, Namespace: "n"})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		t0 := time.Now()
		for i := 0; i < events; i++ {
			if _, err := w.Recv(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return events / time.Since(t0).Seconds()
	}
	var alone, shared []float64
	for i := 0; i < b.N; i++ {
		alone = append(alone, rate())
		slow, err := conn.Watch(ctx, Call{Export: "watch", Input: map[string]*caminopb.Value{"key": str("s")}, Namespace: "n"})
		if err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				if _, err := slow.Recv(ctx); err != nil {
					return
				}
			}
		}()
		shared = append(shared, rate())
		close(stop)
		<-done
		slow.Close()
	}
	ma, ms := pkgruntimetest.Median(alone), pkgruntimetest.Median(shared)
	b.ReportMetric(ma, "alone-events/s")
	b.ReportMetric(ms, "beside-a-slow-reader-events/s")
	b.ReportMetric(ms/ma, "ratio")
}
