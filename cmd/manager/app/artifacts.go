package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// DefaultArtifactGCInterval is how often unreferenced artifacts are
// collected by default.
const DefaultArtifactGCInterval = 10 * time.Minute

// artifactGCSteps bounds one collection (removals); the next continues.
const artifactGCSteps = 4096

// ArtifactOptions configure OCI sources: the manager's --artifact-store,
// --artifact-store-max-bytes, --registry-config, --registry-ca,
// --registry-plain-http, --artifact-pull-timeout and --artifact-gc-interval.
type ArtifactOptions struct {
	// Store is the content-addressed store's directory.
	Store string
	// MaxBytes bounds the store.
	MaxBytes int64
	// RegistryConfig is a docker config.json with credentials (optional).
	RegistryConfig string
	// RegistryCA is a PEM CA bundle trusted for registries.
	RegistryCA string
	// PlainHTTP allows plain HTTP to loopback registries.
	PlainHTTP bool
	// PullTimeout bounds one pull.
	PullTimeout time.Duration
	// GCInterval is how often unreferenced artifacts are collected; 0 never.
	GCInterval time.Duration
	// RetryBase and RetryMax bound the backoff of artifact_unavailable
	// pulls (0: the defaults, 1 s doubling to 2 min).
	RetryBase, RetryMax time.Duration
}

// lazyArtifacts opens the store on first use: a manager that never sees
// an OCI source never creates it.
type lazyArtifacts struct {
	o   ArtifactOptions
	log logr.Logger

	mu       sync.Mutex
	resolver *artifacts.Resolver
}

func (l *lazyArtifacts) get() (*artifacts.Resolver, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resolver != nil {
		return l.resolver, nil
	}
	store, err := artifacts.OpenStore(l.o.Store, l.o.MaxBytes)
	if err != nil {
		return nil, err
	}
	p, err := artifacts.NewPuller(artifacts.PullerOptions{
		RegistryOptions: artifacts.RegistryOptions{Config: l.o.RegistryConfig, CAFile: l.o.RegistryCA, PlainHTTP: l.o.PlainHTTP, UserAgent: "iteron-manager"},
		Store:           store, Timeout: l.o.PullTimeout,
	})
	if err != nil {
		return nil, err
	}
	l.resolver = artifacts.NewResolver(p, l.o.RetryBase, l.o.RetryMax)
	l.resolver.OnDone = func(ref string) { l.log.V(1).Info("pull ended", "ref", ref) }
	return l.resolver, nil
}

// Resolve implements verifier.ArtifactResolver.
func (l *lazyArtifacts) Resolve(ref, token string) (*artifacts.Layout, error) {
	r, err := l.get()
	if err != nil {
		return nil, &artifacts.Error{Code: reasons.ArtifactUnavailable, Ref: ref, RetryAfter: 10 * time.Second,
			Detail: fmt.Sprintf("the artifact store %s cannot be opened: %v", l.o.Store, err), Err: err}
	}
	return r.Resolve(ref, token)
}

// Store implements verifier.ArtifactResolver.
func (l *lazyArtifacts) Store() *artifacts.Store {
	r, err := l.get()
	if err != nil {
		return nil
	}
	return r.Store()
}

// opened returns the resolver when the store was opened.
func (l *lazyArtifacts) opened() *artifacts.Resolver {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.resolver
}

// pulled is the pull that laid out plan's source, for the trace of the
// first transaction that runs it (hotswap.Config.Pulled).
func (l *lazyArtifacts) pulled(plan verifier.LaunchPlan) (hotswap.PullTiming, bool) {
	r := l.opened()
	if r == nil {
		return hotswap.PullTiming{}, false
	}
	p, ok := r.TakePull(plan.ArtifactRoot())
	return hotswap.PullTiming{Digest: p.Digest, Start: p.Start, End: p.End}, ok
}

// artifactGC collects, every interval, the sources and blobs no
// ImplementationActivation on this node names (spec.sources[].oci.ref) and
// no Generation on this node uses (its catalog path or artifact root lies
// in the store: active, kept in history, a rollback target, or what
// recovery would relaunch), nor any source resolved in the last 30 minutes.
type artifactGC struct {
	a        *lazyArtifacts
	c        client.Reader
	interval time.Duration
	log      logr.Logger
}

func (g *artifactGC) Start(ctx context.Context) error {
	if g.interval <= 0 {
		return nil
	}
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := g.collect(ctx); err != nil {
			g.log.Error(err, "artifact GC")
		}
	}
}

// collect runs one bounded collection.
func (g *artifactGC) collect(ctx context.Context) (artifacts.GCReport, error) {
	r := g.a.opened()
	if r == nil {
		return artifacts.GCReport{}, nil // no store: nothing was ever pulled
	}
	keep, err := g.keepSet(ctx, true)
	if err != nil {
		return artifacts.GCReport{}, err
	}
	gcCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep, err := r.Store().GC(gcCtx, keep, artifactGCSteps)
	if err == nil && (len(rep.RemovedSources) > 0 || len(rep.RemovedBlobs) > 0) {
		g.log.Info("collected unreferenced artifacts", "sources", len(rep.RemovedSources), "blobs", len(rep.RemovedBlobs), "freedBytes", rep.FreedBytes, "kept", rep.KeptSources, "incomplete", rep.Incomplete)
	}
	return rep, err
}

// keepSet is the reference digests nothing may collect: every oci.ref of an
// activation on this node, the source of every Generation on this node, and
// (with recent) every source resolved within the grace period.
func (g *artifactGC) keepSet(ctx context.Context, recent bool) (map[string]bool, error) {
	r := g.a.opened()
	keep := map[string]bool{}
	if r == nil {
		return keep, nil
	}
	if recent {
		keep = r.RecentlyUsed()
	}
	var acts iteronv1.ImplementationActivationList
	if err := g.c.List(ctx, &acts); err != nil {
		return nil, fmt.Errorf("list activations: %w", err)
	}
	for _, a := range acts.Items {
		for _, s := range a.Spec.Sources {
			if s.OCI != nil {
				if ref, err := artifacts.ParseRef(s.OCI.Ref); err == nil {
					keep[ref.Digest] = true
				}
			}
		}
	}
	var gens iteronv1.GenerationList
	if err := g.c.List(ctx, &gens); err != nil {
		return nil, fmt.Errorf("list generations: %w", err)
	}
	store := r.Store()
	for _, gen := range gens.Items {
		for _, p := range []string{gen.Spec.Implementation.CatalogPath, gen.Spec.Implementation.ArtifactRoot} {
			if d, ok := store.SourceOf(p); ok {
				keep[d] = true
			}
		}
	}
	return keep, nil
}
