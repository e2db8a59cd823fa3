package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// verificationKey is everything besides the files on disk that an
// activation's resolution depends on. It is the one definition of "the same
// verification": a later input (a policy's generation, a trusted root's
// digest) is a field added here, and every entry made without it stops
// matching.
type verificationKey struct {
	// uid tells a re-created activation of the same name from the old one.
	uid types.UID
	// generation is the spec's metadata.generation: any spec change moves
	// it.
	generation int64
	// sources is the digest of the sources' pinned digests (manifest,
	// artifact, OCI reference) by module, so that an entry never answers
	// for sources other than those it verified, whatever generation says.
	sources string
}

// verificationKeyOf is the key of an activation's spec as it is now.
func verificationKeyOf(act *iteronv1.ImplementationActivation) verificationKey {
	type pinned struct {
		Module, ImplementationID, ManifestSHA256, ArtifactSHA256, OCIRef string
	}
	pins := make([]pinned, 0, len(act.Spec.Sources))
	for _, s := range act.Spec.Sources {
		p := pinned{Module: s.Module, ImplementationID: s.ImplementationID, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
		if s.OCI != nil {
			p.OCIRef = s.OCI.Ref
		}
		pins = append(pins, p)
	}
	// Marshalling a slice of flat string structs cannot fail.
	data, _ := json.Marshal(pins)
	sum := sha256.Sum256(data)
	return verificationKey{uid: act.UID, generation: act.Generation, sources: hex.EncodeToString(sum[:])}
}

// verificationCache keeps each activation's last reusable resolution, so
// that a reconcile with nothing changed (a resync, a coordinator
// notification, the watch event of its own status write) does not read and
// hash every catalog and executable again. An entry answers only for its
// key and only while every file it read is unchanged (a stat each, no
// read): a file rewritten on disk is verified again at the next reconcile.
type verificationCache struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]cachedResolution
}

type cachedResolution struct {
	key verificationKey
	res Resolution
}

// get returns the resolution kept for name when it was made for key and
// none of its files changed since.
func (c *verificationCache) get(name types.NamespacedName, key verificationKey) (Resolution, bool) {
	c.mu.Lock()
	e, ok := c.entries[name]
	c.mu.Unlock()
	if !ok || e.key != key {
		return Resolution{}, false
	}
	for _, f := range e.res.Files {
		if !f.Unchanged() {
			return Resolution{}, false
		}
	}
	return e.res, true
}

// put keeps res for name under key when it may be reused, and otherwise
// drops what was kept (an older resolution must not answer for a spec
// whose verification just failed).
func (c *verificationCache) put(name types.NamespacedName, key verificationKey, res Resolution) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !res.Reusable {
		delete(c.entries, name)
		return
	}
	if c.entries == nil {
		c.entries = map[types.NamespacedName]cachedResolution{}
	}
	c.entries[name] = cachedResolution{key: key, res: res}
}

// forget drops what is kept for an activation that is gone.
func (c *verificationCache) forget(name types.NamespacedName) {
	c.mu.Lock()
	delete(c.entries, name)
	c.mu.Unlock()
}
