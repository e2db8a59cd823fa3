package pkgruntimetest

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	caminopb "iteron.dev/operator/api/quixos/camino"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
)

// Direct is a bare grpc-go client of a started runtime: the baseline the
// benchmarks compare the host's paths with. It learns the runtime's
// instance ID and revision from one Handshake (not checked: that is the
// host's job) and signs each call's grant with the runtime's key itself.
type Direct struct {
	client   runtimepb.PackageRuntimeClient
	key      []byte
	instance string
	revision string
	next     atomic.Uint64
}

// DialDirect connects to r and runs one Handshake; the test's cleanup
// closes the connection.
func DialDirect(tb testing.TB, r *Runtime) *Direct {
	tb.Helper()
	cc, err := grpc.NewClient("unix://"+r.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	d := &Direct{client: runtimepb.NewPackageRuntimeClient(cc), key: r.Key}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := d.client.Handshake(ctx, &runtimepb.HandshakeRequest{OrchProtocolVersion: "quixos.runtime/1", Nonce: hex.EncodeToString(make([]byte, 32))}, grpc.WaitForReady(true))
	if err != nil {
		tb.Fatal(err)
	}
	d.instance, d.revision = resp.GetInstanceId(), resp.GetPackageRevisionId()
	return d
}

// Invoke makes one call of export with input, as namespace "bench", and
// reports the runtime's ok.
func (d *Direct) Invoke(ctx context.Context, export string, input map[string]*caminopb.Value) (bool, error) {
	id := "direct-" + strconv.FormatUint(d.next.Add(1), 10)
	mac := hmac.New(sha256.New, d.key)
	mac.Write([]byte(id + "\n" + "bench" + "\n" + export))
	resp, err := d.client.Invoke(ctx, &runtimepb.InvokeRequest{
		InvocationId: id, Export: &quixospb.PackageExportRef{PackageRevisionId: d.revision, ExportId: export}, Input: input,
		Context: &runtimepb.InvocationContext{InstanceId: d.instance, Grant: "bench:" + hex.EncodeToString(mac.Sum(nil))},
	})
	return resp.GetOk(), err
}

// Median is the median of v (the upper one of an even count).
func Median[T cmp.Ordered](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// DirNames lists the names in dir (the test fails if it cannot).
func DirNames(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}
