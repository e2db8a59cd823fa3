package fleet

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Revision is one template revision of a set: an apps/v1 ControllerRevision
// named <set>-<hash> whose data is the template.
type Revision struct {
	// Name is the ControllerRevision's name.
	Name string
	// Hash is the label value nodes on this revision carry.
	Hash string
	// Number orders revisions (ControllerRevision.revision).
	Number int64
	// Template is the activation template of this revision.
	Template *iteronv1.ActivationTemplate
}

// TemplateHash is the hash of a template: 10 hex digits of SHA-256 over its
// JSON and the set's collision count (a hash that names a revision with
// another template bumps the count, as the DaemonSet controller does).
func TemplateHash(tpl *iteronv1.ActivationTemplate, collisionCount *int32) (string, error) {
	data, err := json.Marshal(tpl)
	if err != nil {
		return "", fmt.Errorf("encode the template: %w", err)
	}
	h := sha256.New()
	h.Write(data)
	if collisionCount != nil {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(*collisionCount))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))[:10], nil
}

// RevisionName is the ControllerRevision name of a set's revision.
func RevisionName(set, hash string) string { return set + "-" + hash }

// NewRevision is the ControllerRevision of set's current template, numbered
// number, owned by the set.
func NewRevision(set *iteronv1.ActivationSet, number int64) (*appsv1.ControllerRevision, error) {
	hash, err := TemplateHash(&set.Spec.Template, set.Status.CollisionCount)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(&set.Spec.Template)
	if err != nil {
		return nil, err
	}
	return &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Name:      RevisionName(set.Name, hash),
			Namespace: set.Namespace,
			Labels:    map[string]string{iteronv1.LabelActivationSet: set.Name, iteronv1.LabelRevision: hash},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(set, iteronv1.GroupVersion.WithKind("ActivationSet")),
			},
		},
		Data:     runtime.RawExtension{Raw: data},
		Revision: number,
	}, nil
}

// RevisionOf reads a ControllerRevision of a set.
func RevisionOf(cr *appsv1.ControllerRevision) (Revision, error) {
	var tpl iteronv1.ActivationTemplate
	if err := json.Unmarshal(cr.Data.Raw, &tpl); err != nil {
		return Revision{}, fmt.Errorf("ControllerRevision %s: data is not an activation template: %w", cr.Name, err)
	}
	hash := cr.Labels[iteronv1.LabelRevision]
	if hash == "" {
		return Revision{}, fmt.Errorf("ControllerRevision %s has no %s label", cr.Name, iteronv1.LabelRevision)
	}
	return Revision{Name: cr.Name, Hash: hash, Number: cr.Revision, Template: &tpl}, nil
}

// SameTemplate reports whether two templates are the same (nil and empty
// lists alike).
func SameTemplate(a, b *iteronv1.ActivationTemplate) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// StampSpec is the spec a node's activation gets from a template; discard
// makes its swaps drop state (a revert with revertStateDisposition Discard).
func StampSpec(tpl *iteronv1.ActivationTemplate, node string, discard bool) iteronv1.ImplementationActivationSpec {
	t := tpl.DeepCopy()
	spec := iteronv1.ImplementationActivationSpec{
		NodeName:               node,
		CandidateSHA256:        t.CandidateSHA256,
		Sources:                t.Sources,
		CapabilityCeiling:      t.CapabilityCeiling,
		Swap:                   t.Swap,
		Checkpoint:             t.Checkpoint,
		GenerationHistoryLimit: t.GenerationHistoryLimit,
		Probes:                 t.Probes,
	}
	if discard {
		spec.Swap.StateDisposition = iteronv1.StateDispositionDiscard
	}
	return spec
}

// Stamped reports whether an activation's spec is the one StampSpec(tpl,
// node, discard) makes, without building it: every field of the spec is
// compared (a test changes each one and expects a difference), lists of no
// items equal to absent ones.
func Stamped(spec *iteronv1.ImplementationActivationSpec, tpl *iteronv1.ActivationTemplate, node string, discard bool) bool {
	swap := tpl.Swap
	if discard {
		swap.StateDisposition = iteronv1.StateDispositionDiscard
	}
	return spec.NodeName == node && !spec.Paused && spec.CandidateSHA256 == tpl.CandidateSHA256 &&
		sameSources(spec.Sources, tpl.Sources) && slices.Equal(spec.CapabilityCeiling, tpl.CapabilityCeiling) &&
		ptr.Equal(spec.GenerationHistoryLimit, tpl.GenerationHistoryLimit) &&
		reflect.DeepEqual(spec.Swap, swap) && reflect.DeepEqual(spec.Checkpoint, tpl.Checkpoint) && sameProbes(spec.Probes, tpl.Probes)
}

func sameProbes(a, b []iteronv1.ActivationProbe) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Module != b[i].Module || a[i].Input != b[i].Input || a[i].Check != b[i].Check ||
			!ptr.Equal(a[i].TimeoutMilliseconds, b[i].TimeoutMilliseconds) {
			return false
		}
	}
	return true
}

func sameSources(a, b []iteronv1.ActivationSource) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !reflect.DeepEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}
