package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/test/fleettest"
)

// The failure table: one row per case, printed by TestMain after the
// tests (case → set status → nodes serving v1 / v2 → pids of the nodes the
// case must not touch unchanged?).
type row struct{ Case, Status, V1, V2, Untouched string }

var table struct {
	sync.Mutex
	rows []row
}

func record(r row) {
	table.Lock()
	defer table.Unlock()
	table.rows = append(table.rows, r)
}

func printTable() {
	table.Lock()
	defer table.Unlock()
	if len(table.rows) == 0 {
		return
	}
	head := row{"case", "set status", "nodes serving v1", "nodes serving v2", "pids of untouched nodes unchanged?"}
	rows := append([]row{head}, table.rows...)
	width := make([]int, 5)
	cells := func(r row) []string { return []string{r.Case, r.Status, r.V1, r.V2, r.Untouched} }
	for _, r := range rows {
		for i, c := range cells(r) {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	fmt.Println("fleet failure table:")
	for k, r := range rows {
		var b strings.Builder
		for i, c := range cells(r) {
			fmt.Fprintf(&b, "| %s%s ", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		fmt.Println(b.String() + "|")
		if k == 0 {
			var sep strings.Builder
			for _, w := range width {
				sep.WriteString("|" + strings.Repeat("-", w+2))
			}
			fmt.Println(sep.String() + "|")
		}
	}
}

// serving sorts the nodes by the major version their prompt_system serves
// (what the manager runs, not what the activation asks for).
func serving(t *testing.T, key client.ObjectKey, nodes []int) (v1, v2 []string) {
	t.Helper()
	for _, i := range nodes {
		n := nodeOf(t, key, i)
		switch {
		case n.impl == "counter-v1":
			v1 = append(v1, n.name)
		case n.impl != "":
			v2 = append(v2, n.name)
		}
	}
	return v1, v2
}

func names(ns []string) string {
	if len(ns) == 0 {
		return "none"
	}
	return strings.Join(ns, ", ")
}

// untouched checks that the nodes kept the provider process they had and
// their activation was never changed, and says so for the table.
func untouched(t *testing.T, key client.ObjectKey, b before, nodes ...int) string {
	t.Helper()
	var same []string
	ok := true
	for _, i := range nodes {
		n := nodeOf(t, key, i)
		was := b.nodes[i]
		same = append(same, fmt.Sprintf("%s %d→%d", n.name, was.pid, n.pid))
		if n.pid != was.pid || !processAlive(n.pid) || n.generation != was.generation {
			ok = false
			t.Errorf("%s was not to be touched: provider pid %d → %d (alive %v), generation %s → %s", n.name, was.pid, n.pid, processAlive(n.pid), was.generation, n.generation)
		}
	}
	verdict := "yes"
	if !ok {
		verdict = "NO"
	}
	return fmt.Sprintf("%s (%s)", verdict, strings.Join(same, ", "))
}

// managersRan checks that no node manager exited (none was restarted).
func managersRan(t *testing.T) string {
	t.Helper()
	var pids []string
	for _, m := range managers {
		if !m.Alive() {
			t.Errorf("%s (pid %d) exited:\n%s", m.Name, m.Pid(), m.Output(4000))
		}
		pids = append(pids, fmt.Sprint(m.Pid()))
	}
	return strings.Join(pids, " ")
}

func statusOf(s *iteronv1.ActivationSet) string {
	out := string(s.Status.Phase)
	if h := s.Status.Halt; h != nil {
		out += fmt.Sprintf(" (%s of %s", h.Action, strings.Join(h.Nodes, ","))
		if h.StateDisposition != "" {
			out += ", state " + string(h.StateDisposition)
		}
		out += ")"
	}
	var failed []string
	for _, f := range s.Status.Failed {
		failed = append(failed, f.Node+" "+f.Reason)
	}
	if len(failed) > 0 {
		out += "; failed: " + strings.Join(failed, ", ")
	}
	return out + fmt.Sprintf("; %d/%d updated", s.Status.UpdatedNodes, s.Status.DesiredNodes)
}

// snapshot is what each pool node runs now.
func snapshot(t *testing.T, key client.ObjectKey) map[int]node {
	out := map[int]node{}
	for _, i := range pool5 {
		out[i] = nodeOf(t, key, i)
	}
	return out
}

// generationsOf are the names of an activation's Generation objects.
func generationsOf(t *testing.T, activation string) []string {
	t.Helper()
	var list iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range list.Items {
		if g.Spec.ActivationName == activation {
			out = append(out, g.Name)
		}
	}
	sort.Strings(out)
	return out
}

// waitGone waits (2 minutes at most) until a node's activation and its
// Generations are gone and its provider process exited.
func waitGone(t *testing.T, key client.ObjectKey, n node, gens []string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var a iteronv1.ImplementationActivation
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(n.activation), &a)
		left := generationsOf(t, n.activation.Name)
		if apierrors.IsNotFound(err) && len(left) == 0 && !processAlive(n.pid) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Node %s was deleted: activation %s (%v, deleting %v, conditions %+v), Generations left %v, provider pid %d alive %v\nthe set's activations:\n%s",
				n.name, n.activation.Name, err, a.DeletionTimestamp != nil, a.Status.Conditions, left, n.pid, processAlive(n.pid), fleettest.DescribeActivations(env.Client, key))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restoreNode puts a Node back as TestMain made it: present, without the
// pool label.
func restoreNode(t *testing.T, name string) {
	var n corev1.Node
	err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n)
	switch {
	case apierrors.IsNotFound(err):
		if err := env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Errorf("re-create Node %s: %v", name, err)
		}
	case err != nil:
		t.Errorf("get Node %s: %v", name, err)
	case n.Labels[pool] != "":
		fleettest.LabelNode(t, env.Client, name, pool, "")
	}
}

// waitActivation waits (3 minutes at most) for node i's activation of the
// set to satisfy cond.
func waitActivation(t *testing.T, key client.ObjectKey, i int, what string, cond func(node) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		n := nodeOf(t, key, i)
		if cond(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's activation never became %s:\n%s", n.name, what, fleettest.DescribeActivations(env.Client, key))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readyNode: the node's activation is Ready for its current spec.
func readyNode(n node) bool {
	if n.activation == nil {
		return false
	}
	r := meta.FindStatusCondition(n.activation.Status.Conditions, iteronv1.ConditionReady)
	return r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == n.activation.Generation
}
