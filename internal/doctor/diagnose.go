package doctor

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/verifier"
)

// DefaultOrphanGrace is how long a live, recorded provider group may go
// unclaimed by any status before it counts as orphaned: the Generation
// status that shows a new process's pid is written shortly after the
// process starts, and a shadow provider of a swap in progress is claimed
// only once its Generation's status is mirrored.
const DefaultOrphanGrace = 30 * time.Second

// Options tune a diagnosis.
type Options struct {
	// Now is the time of the diagnosis (time.Now when zero); it stamps the
	// retry command and measures how long a deletion has been pending.
	Now time.Time
	// OrphanGrace is DefaultOrphanGrace when zero; negative means none.
	OrphanGrace time.Duration
	// Graph is the seam graph dependency chains are read from (the
	// built-in graph when nil, as the manager uses).
	Graph *catalog.SeamGraph
}

// conditionOrder is the order conditions are shown in.
var conditionOrder = []string{
	iteronv1.ConditionReady, iteronv1.ConditionReconciling, iteronv1.ConditionStalled,
	iteronv1.ConditionDegraded, iteronv1.ConditionVerified,
}

// resource is how commands name the activation's resource, unambiguous
// whatever else is installed.
const resource = "implementationactivations.iteron.dev"

// Diagnose judges what in holds (and, when local is not nil, what was read
// on the node) and returns the report. It is a pure function of its
// arguments and the options' clock.
func Diagnose(in *Input, local *Local, opts Options) *Report {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.OrphanGrace == 0 {
		opts.OrphanGrace = DefaultOrphanGrace
	}
	if opts.Graph == nil {
		opts.Graph = catalog.BuiltinSeamGraph()
	}
	act := in.Activation
	d := &diagnosis{in: in, local: local, opts: opts, act: act, r: &Report{
		Activation:         ObjectRef{Namespace: act.Namespace, Name: act.Name, UID: string(act.UID), NodeName: act.Spec.NodeName},
		Generation:         act.Generation,
		ObservedGeneration: act.Status.ObservedGeneration,
		Paused:             act.Spec.Paused,
		Finalizers:         slices.Clone(act.Finalizers),
		ModuleCount:        len(act.Spec.Sources),
	}}
	if act.DeletionTimestamp != nil {
		t := act.DeletionTimestamp.Time
		d.r.Deleting = &t
	}
	for _, u := range in.Unread {
		d.add(Finding{Code: FindingPartialView, Severity: SeverityInfo, Summary: "could not read " + u + "; the diagnosis may miss what those objects would show"})
	}
	d.conditions()
	d.observed()
	d.node()
	d.retry()
	d.modules()
	d.ledger()
	d.processes()
	d.receipts()
	d.events()
	d.summarize()
	return d.r
}

type diagnosis struct {
	in    *Input
	local *Local
	opts  Options
	act   *iteronv1.ImplementationActivation
	r     *Report
}

func (d *diagnosis) add(f Finding) { d.r.Findings = append(d.r.Findings, f) }

func (d *diagnosis) kubectl(verb string, rest ...string) string {
	return strings.Join(append([]string{"kubectl", verb, resource, d.act.Name, "-n", d.act.Namespace}, rest...), " ")
}

func (d *diagnosis) conditions() {
	for _, t := range conditionOrder {
		c := meta.FindStatusCondition(d.act.Status.Conditions, t)
		if c == nil {
			d.r.Conditions = append(d.r.Conditions, ConditionSummary{Type: t, Status: "Missing"})
			continue
		}
		d.r.Conditions = append(d.r.Conditions, ConditionSummary{
			Type: t, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
			Stale: c.ObservedGeneration < d.act.Generation,
		})
	}
}

func (d *diagnosis) condition(t string) *metav1.Condition {
	return meta.FindStatusCondition(d.act.Status.Conditions, t)
}

// observed reports a manager that has not acted on the current spec.
func (d *diagnosis) observed() {
	observed, gen := d.act.Status.ObservedGeneration, d.act.Generation
	switch {
	case observed >= gen:
		return
	case observed == 0 && len(d.act.Status.Conditions) == 0:
		d.add(Finding{Code: FindingNotObserved, Severity: SeverityProblem,
			Summary: fmt.Sprintf("no manager has written this activation's status: the manager of node %s has not seen it", d.act.Spec.NodeName),
			Hint:    fmt.Sprintf("Check that a manager runs with --node-name=%s (the DaemonSet's pod on that node) and that spec.nodeName is the node's name.", d.act.Spec.NodeName)})
	default:
		d.add(Finding{Code: FindingNotObserved, Severity: SeverityProblem,
			Summary: fmt.Sprintf("status describes spec generation %d but the spec is at generation %d: the manager of node %s has not acted on the latest change", observed, gen, d.act.Spec.NodeName),
			Hint:    "If this lasts more than a few seconds, check the manager on that node (its pod's logs)."})
	}
}

// node reports what is known of the Node and, for an activation being
// deleted, whether its finalizer can ever be released.
func (d *diagnosis) node() {
	n, name := d.in.Node, d.act.Spec.NodeName
	ns := NodeStatus{Name: name}
	switch {
	case n.Err != "":
		ns.State, ns.Detail = NodeUnknown, "Nodes could not be read: "+n.Err
	case n.Exists:
		ns.State = NodePresent
	case n.OtherNodes:
		ns.State = NodeMissing
	default:
		ns.State, ns.Detail = NodeUnknown, "the cluster has no Node objects at all (a control plane without kubelets, like the local one), so whether the node exists cannot be told"
	}
	d.r.Node = ns

	held := d.r.Deleting != nil && slices.Contains(d.act.Finalizers, iteronv1.FinalizerActivation)
	remove := d.removeFinalizerCommand()
	since := ""
	if d.r.Deleting != nil {
		since = fmt.Sprintf(" (deletion requested %s ago)", d.opts.Now.Sub(*d.r.Deleting).Round(time.Second))
	}
	switch {
	case held && ns.State == NodeMissing:
		d.add(Finding{Code: FindingFinalizerStuck, Severity: SeverityProblem,
			Summary: fmt.Sprintf("the activation is being deleted%s but its finalizer %s waits for the manager of node %s, and Node %s no longer exists: no manager will ever release it", since, iteronv1.FinalizerActivation, name, name),
			Hint: fmt.Sprintf("With the node gone its providers are gone too. Remove the finalizer (the JSON patch tests that it is still at that index), then delete the Generations left behind if the cluster has no garbage collector.%s",
				d.leftGenerationsHint()),
			Commands: remove})
	case held && ns.State == NodeUnknown:
		d.add(Finding{Code: FindingDeletionPending, Severity: SeverityProblem,
			Summary:  fmt.Sprintf("the activation is being deleted%s and its finalizer %s waits for the manager of node %s; Node %s: unknown: %s", since, iteronv1.FinalizerActivation, name, name, ns.Detail),
			Hint:     fmt.Sprintf("If a manager runs for node %s it retires every module and releases the finalizer: check its logs. Only if you know that no manager will ever run for %s (and no provider of this activation runs there), remove the finalizer with the command below.", name, name),
			Commands: remove})
	case held:
		d.add(Finding{Code: FindingDeletionPending, Severity: SeverityProblem,
			Summary: fmt.Sprintf("the activation is being deleted%s and the manager of node %s (which exists) has not released its finalizer %s yet", since, name, iteronv1.FinalizerActivation),
			Hint:    fmt.Sprintf("The manager retires every module in drain order, reaps every process and deletes the Generations first; if this lasts, check the manager's logs on %s. Do not remove the finalizer while that manager runs: it would leave providers running.", name)})
	case d.r.Deleting == nil && ns.State == NodeMissing:
		d.add(Finding{Code: FindingNodeMissing, Severity: SeverityProblem,
			Summary: fmt.Sprintf("Node %s does not exist (other Nodes do): no manager runs this activation", name),
			Hint:    "spec.nodeName is immutable: create the activation again under the right node name, or bring the node back."})
	case d.r.Deleting == nil && ns.State == NodeUnknown:
		d.add(Finding{Code: FindingNodeUnknown, Severity: SeverityInfo,
			Summary: fmt.Sprintf("Node %s: unknown: %s", name, ns.Detail)})
	}
}

// removeFinalizerCommand is the JSON patch that removes exactly our
// finalizer: a test operation guards the index, so a list that changed in
// between makes the patch fail instead of removing another finalizer.
func (d *diagnosis) removeFinalizerCommand() []string {
	i := slices.Index(d.act.Finalizers, iteronv1.FinalizerActivation)
	if i < 0 {
		return nil
	}
	patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`, i, iteronv1.FinalizerActivation, i)
	return []string{d.kubectl("patch", "--type=json", "-p", "'"+patch+"'")}
}

// leftGenerationsHint names the Generations the activation still owns.
func (d *diagnosis) leftGenerationsHint() string {
	if len(d.in.Generations) == 0 {
		return ""
	}
	names := make([]string, 0, len(d.in.Generations))
	for _, g := range d.in.Generations {
		names = append(names, g.Name)
	}
	slices.Sort(names)
	return fmt.Sprintf(" Generations left: kubectl delete generations.iteron.dev -n %s %s", d.act.Namespace, strings.Join(names, " "))
}

func (d *diagnosis) retry() {
	req, handled := d.act.Annotations[iteronv1.AnnotationRetry], d.act.Status.LastHandledRetryAt
	d.r.Retry = RetryStatus{Requested: req, Handled: handled, Pending: req != "" && req != handled}
	if !d.r.Retry.Pending {
		return
	}
	f := Finding{Code: FindingRetryPending, Severity: SeverityProblem,
		Summary: fmt.Sprintf("a retry was requested (%s=%s) but the manager has not handled it (lastHandledRetryAt=%q)", iteronv1.AnnotationRetry, req, handled)}
	if d.act.Spec.Paused {
		f.Summary += "; spec.paused is true, and a paused activation acts on no request"
		f.Commands = []string{d.unpauseCommand()}
	} else {
		f.Hint = "The manager handles it at its next reconcile, within seconds; if it lasts, check the manager of node " + d.act.Spec.NodeName + "."
	}
	d.add(f)
}

func (d *diagnosis) unpauseCommand() string {
	return d.kubectl("patch", "--type=merge", "-p", `'{"spec":{"paused":false}}'`)
}

func (d *diagnosis) retryCommand() string {
	return d.kubectl("annotate", iteronv1.AnnotationRetry+"="+d.opts.Now.UTC().Format(time.RFC3339), "--overwrite")
}

// modules diagnoses every module of the spec (and any the status still
// shows) that does not serve its desired implementation.
func (d *diagnosis) modules() {
	status := map[string]iteronv1.ModuleStatus{}
	var order []string
	for _, ms := range d.act.Status.Modules {
		status[ms.Module] = ms
		order = append(order, ms.Module)
	}
	desired := map[string]iteronv1.ActivationSource{}
	for _, src := range d.act.Spec.Sources {
		desired[src.Module] = src
		if _, ok := status[src.Module]; !ok {
			order = append(order, src.Module)
		}
	}
	// A module whose transaction failed holds the rest of its plan.
	failed := ""
	for _, m := range order {
		if ms, ok := status[m]; ok && isTransactionFailure(ms.Reason) {
			failed = m
			break
		}
	}
	paused := ""
	if d.act.Spec.Paused {
		paused = " (spec.paused is true: spec changes are not acted on)"
	}
	for _, m := range order {
		ms, inStatus := status[m]
		src, inSpec := desired[m]
		activeGen := d.generation(ms.GenerationName)
		if activeGen != nil && activeGen.Status.Sandbox != nil {
			d.r.Sandboxes = append(d.r.Sandboxes, SandboxSummary{Module: m, Generation: activeGen.Name,
				Sandbox: sandboxLine(activeGen.Status.Sandbox), Violations: activeGen.Status.Sandbox.Violations})
		}
		mismatch := ""
		if inStatus && inSpec {
			mismatch = implementationMismatch(ms, src, activeGen)
		}
		// Only an Active module serves: status keeps the implementation of
		// a Failed or relaunching active generation, which serves nothing.
		serving := inStatus && ms.Phase == iteronv1.PhaseActive
		if serving && inSpec {
			d.r.ServingCount++
		}
		if serving && inSpec {
			for _, diag := range ms.Diagnostics {
				d.add(Finding{Code: FindingOptionalDependencyMissing, Severity: SeverityInfo, Module: m,
					Summary: fmt.Sprintf("module %s is Active without an optional dependency: %s", m, diag),
					Hint:    "Nothing to do unless the module should use it: add a source for it (within the seam graph's version range) to the activation."})
			}
		}
		if serving && inSpec && ms.Reason == "" && mismatch == "" {
			d.r.ActiveCount++
			continue
		}
		md := ModuleDiagnosis{Module: m, DesiredImplementationID: src.ImplementationID, Phase: string(ms.Phase), Reason: ms.Reason, Message: ms.Message}
		if serving {
			md.ImplementationID = ms.ImplementationID
		}
		md.Active, md.Target = d.generationsOf(m, ms.GenerationName)
		md.LastBlock = d.lastBlock(m)
		if ms.Phase != iteronv1.PhaseActive {
			md.Chain = dependencyChain(d.opts.Graph, m, status)
			md.ChainText = chainText(md.Chain)
		}
		d.r.Modules = append(d.r.Modules, md)

		switch {
		case !inSpec:
			d.add(Finding{Code: FindingSpecNotApplied, Severity: SeverityProblem, Module: m,
				Summary: fmt.Sprintf("module %s was removed from the spec but status still shows it (%s)%s", m, describePhase(ms), paused)})
		case !inStatus:
			d.add(d.notApplied(Finding{Code: FindingSpecNotApplied, Severity: SeverityProblem, Module: m,
				Summary: fmt.Sprintf("module %s (%s) is in the spec but not in status: it was never acted on%s", m, src.ImplementationID, paused)}))
		case ms.Phase == iteronv1.PhaseActive && ms.Reason != "":
			d.add(d.swapFailed(md))
		case failed != "" && failed != m && ms.Reason == "" && !d.act.Spec.Paused:
			d.add(Finding{Code: FindingPlanWaiting, Severity: SeverityProblem, Module: m,
				Summary: fmt.Sprintf("module %s is %s and not at its desired implementation: it waits because module %s failed earlier in the same plan (transactions of a plan run one at a time; after a failure the rest wait)", m, describePhase(ms), failed),
				Hint:    fmt.Sprintf("Fix %s; changing the spec or setting %s starts a new attempt.", failed, iteronv1.AnnotationRetry)})
		case ms.Phase == iteronv1.PhaseActive:
			d.add(d.notApplied(Finding{Code: FindingSpecNotApplied, Severity: SeverityProblem, Module: m,
				Summary: fmt.Sprintf("module %s %s%s", m, mismatch, paused)}))
		case md.ChainText != "" && (ms.Reason == "" || isDependencyCode(ms.Reason)):
			d.add(Finding{Code: FindingDependencyBlocked, Severity: SeverityProblem, Module: m,
				Summary: md.ChainText,
				Hint:    fmt.Sprintf("Fix %s; %s starts once every module it depends on is Active.", md.Chain[len(md.Chain)-1].Module, m)})
		case isDependencyCode(ms.Reason):
			d.add(Finding{Code: FindingDependencyBlocked, Severity: SeverityProblem, Module: m,
				Summary: fmt.Sprintf("module %s is %s: %s: %s", m, describePhase(ms), ms.Reason, ms.Message),
				Hint:    dependencyHint(ms.Reason)})
		default:
			d.add(d.notActive(md))
		}
	}
}

// implementationMismatch says how what serves differs from the source the
// spec pins ("" when it does not): the implementation ID from status, and
// the digests from the active Generation's spec when that object is there.
func implementationMismatch(ms iteronv1.ModuleStatus, src iteronv1.ActivationSource, active *iteronv1.Generation) string {
	switch {
	case ms.ImplementationID != src.ImplementationID:
		return fmt.Sprintf("runs %s (%s) but the spec asks for %s", orDash(ms.ImplementationID), orDash(ms.GenerationName), src.ImplementationID)
	case active == nil:
		return ""
	case active.Spec.Implementation.ArtifactSHA256 != src.ArtifactSHA256:
		return fmt.Sprintf("runs %s with artifact %s (%s) but the spec pins artifact %s", ms.ImplementationID, active.Spec.Implementation.ArtifactSHA256, active.Name, src.ArtifactSHA256)
	case active.Spec.Implementation.ManifestSHA256 != src.ManifestSHA256:
		return fmt.Sprintf("runs %s with manifest %s (%s) but the spec pins manifest %s", ms.ImplementationID, active.Spec.Implementation.ManifestSHA256, active.Name, src.ManifestSHA256)
	}
	return ""
}

// generation returns the activation's Generation called name, or nil.
func (d *diagnosis) generation(name string) *iteronv1.Generation {
	if name == "" {
		return nil
	}
	for i := range d.in.Generations {
		if d.in.Generations[i].Name == name {
			return &d.in.Generations[i]
		}
	}
	return nil
}

// notApplied adds, when paused, the command that unpauses.
func (d *diagnosis) notApplied(f Finding) Finding {
	if d.act.Spec.Paused {
		f.Hint = "Unpause to let the manager act on the spec."
		f.Commands = []string{d.unpauseCommand()}
	} else {
		f.Hint = "The manager acts on spec changes within seconds; if this lasts, see the other findings and the manager of node " + d.act.Spec.NodeName + "."
	}
	return f
}

// swapFailed: the old generation serves; the change to the target failed.
func (d *diagnosis) swapFailed(md ModuleDiagnosis) Finding {
	f := Finding{Code: FindingSwapFailed, Severity: SeverityProblem, Module: md.Module}
	target, where := "the new target", ""
	if t := md.Target; t != nil {
		target = fmt.Sprintf("%s (%s, attempt %d)", t.Name, t.ImplementationID, t.Attempt)
		// The Generation's step after a rollback is rolled_back; where it
		// failed is the phase of its transaction's blocked record.
		if b := md.LastBlock; b != nil && (t.TransactionID == "" || t.TransactionID == b.TransactionID) {
			where = " at " + b.Phase
			if b.Ending != "" {
				where += " (" + strings.ReplaceAll(b.Ending, "_", " ") + ")"
			}
		} else if t.Step != "" && t.Step != string(iteronv1.StepRolledBack) {
			where = " at step " + t.Step
		}
	}
	active := md.ImplementationID
	if md.Active != nil {
		active = fmt.Sprintf("%s (%s)", md.Active.Name, md.Active.ImplementationID)
	}
	f.Summary = fmt.Sprintf("module %s still serves %s: the change to %s failed%s: %s: %s", md.Module, active, target, where, md.Reason, md.Message)
	switch md.Reason {
	case reasons.AuthorityChanged:
		f.Hint = "The admitted capabilities differ from the running generation's, which a hot swap refuses. Set spec.swap.strategy to Cold (no state moves), or restore the capability ceiling."
	case reasons.UnsupportedVersion:
		f.Hint = "A Hot/Migrate swap between protocol 1 and 2 is refused: set spec.swap.strategy to Cold or spec.swap.stateDisposition to Discard."
	default:
		f.Hint = "A failed swap is not retried for the same target. Fix the provider (see its stderr tail and the ledger's blocked record) or change the spec; to try the same target again, request a retry:"
		f.Commands = []string{d.retryCommand()}
	}
	return f
}

// notActive: no generation serves the module.
func (d *diagnosis) notActive(md ModuleDiagnosis) Finding {
	f := Finding{Code: FindingModuleNotActive, Severity: SeverityProblem, Module: md.Module}
	phase := md.Phase
	if phase == "" {
		phase = string(iteronv1.PhaseInactive)
	}
	switch {
	case md.Reason != "":
		f.Summary = fmt.Sprintf("module %s is %s: %s: %s", md.Module, phase, md.Reason, md.Message)
	case md.Target != nil && md.Target.Phase == string(iteronv1.PhasePreparing):
		f.Summary = fmt.Sprintf("module %s is %s: %s is being activated (step %s)", md.Module, phase, md.Target.Name, md.Target.Step)
		f.Hint = "A transaction is in progress; run the doctor again in a few seconds."
	default:
		f.Summary = fmt.Sprintf("module %s is %s with no reason in status", md.Module, phase)
		f.Hint = "The manager has not started it yet; if this lasts, check the manager of node " + d.act.Spec.NodeName + "."
	}
	switch md.Reason {
	case reasons.VerificationFailed, reasons.SchemaMismatch, reasons.UnsupportedVersion:
		f.Hint = verificationHint(md.Message, d.act.Spec.NodeName)
		if g := md.Active; g != nil && g.Phase == string(iteronv1.PhaseFailed) && g.Reason == md.Reason {
			// The generation that served was refused a relaunch (after a
			// crash or a restart): its files changed since it was admitted.
			// A refusal is not retried by itself.
			f.Hint = fmt.Sprintf("The relaunch of %s (%s), which served the module, was refused: the files it was admitted with changed on node %s (`kubectl iteron digest artifact <executable>` shows what is there now). Restore them, or change the spec; a refused relaunch is not retried by itself, so then request a retry:", g.Name, g.ImplementationID, d.act.Spec.NodeName)
			f.Commands = []string{d.retryCommand()}
		}
	case reasons.AuthorityChanged:
		f.Hint = "The node's capability ceiling changed since the generation was admitted; a relaunch with other authority is refused. Restore the ceiling, or change the spec (a new attempt is verified afresh)."
	case reasons.LedgerCorrupt:
		f.Hint = "The manager does not act on an activation whose ledger does not verify. Run the doctor on the node with --state-dir to see the broken rule; deleting the activation archives the ledger."
	case reasons.ActivationFailed, reasons.ProviderFailed, reasons.DeadlineExceeded, reasons.RollbackFailed:
		f.Hint = "The provider failed; its stderr tail and the ledger's blocked record say where. Fix it and change the spec, or request a retry:"
		f.Commands = []string{d.retryCommand()}
	}
	return f
}

// verificationHint is the advice for a source that does not verify, fitted
// to what the verifier found: a path outside the allowed roots is fixed by
// moving the files or widening the manager's --allowed-roots, a symlink by
// naming its target (the manager follows none), anything else by comparing
// digests. Digest advice for a path problem would send the reader to a
// command that cannot help.
func verificationHint(message, node string) string {
	field := messageField(message)
	switch {
	case strings.Contains(message, verifier.PhraseOutsideAllowedRoots):
		return fmt.Sprintf("%s names a path outside the allowed roots of the manager on node %s. Move the catalog and artifact root under an allowed root and change the source's paths to match, or add their directory to the manager's --allowed-roots (the DaemonSet's args); --allowed-roots may not overlap --state-dir. `kubectl iteron validate --allowed-roots <the manager's roots>` checks the result offline.", field, node)
	case strings.Contains(message, verifier.PhraseSymlinkTo):
		link, target := splitAround(message, " "+verifier.PhraseSymlinkTo+" ")
		return fmt.Sprintf("%s reaches its file through a symlink: %s points to %s, and the manager follows no symlink. Name the target's path in the source instead (it must still lie under the allowed roots), or replace the link on node %s by the file or directory itself.", field, link, target, node)
	case strings.Contains(message, verifier.PhraseResolvesThroughSymlink):
		path, rest := splitAround(message, " resolves to ")
		target := strings.TrimSuffix(rest, " "+verifier.PhraseResolvesThroughSymlink)
		return fmt.Sprintf("%s reaches its file through a symlink: %s resolves to %s, and the manager follows no symlink. Name %s in the source instead (it must still lie under the allowed roots), or replace the link on node %s by the directory itself.", field, path, target, target, node)
	}
	return fmt.Sprintf("The source does not verify against the files on node %s. On the node, `kubectl iteron digest artifact <executable>` and `kubectl iteron digest manifest <catalog>` print the digests to compare with spec.sources[]; `kubectl iteron validate` checks the whole document.", node)
}

// messageField is the field a verification message starts with
// ("spec.sources[0].catalogPath: …"), or "The source" when it names none.
func messageField(message string) string {
	if i := strings.Index(message, ": "); i > 0 && strings.HasPrefix(message, "spec.") && !strings.Contains(message[:i], " ") {
		return message[:i]
	}
	return "The source"
}

// splitAround returns the word before sep (the path, after any "field: "
// prefix) and the word after it (up to the next space), as the verifier
// writes them: "<field>: <path> <sep> <target>".
func splitAround(message, sep string) (before, after string) {
	i := strings.Index(message, sep)
	if i < 0 {
		return "", ""
	}
	before = message[:i]
	if j := strings.LastIndex(before, " "); j >= 0 {
		before = before[j+1:]
	}
	after = message[i+len(sep):]
	if j := strings.IndexByte(after, ' '); j >= 0 {
		after = after[:j]
	}
	return before, after
}

// isTransactionFailure reports a reason that a failed transaction leaves
// (as opposed to a source that does not verify or a dependency that waits).
func isTransactionFailure(code string) bool {
	switch code {
	case "", reasons.VerificationFailed, reasons.SchemaMismatch, reasons.DependencyUnsatisfied, reasons.DependencyCycle, reasons.DependencyConflict:
		return false
	}
	return true
}

// dependencyHint says what to change for a dependency reason.
func dependencyHint(code string) string {
	if code == reasons.DependencyConflict {
		return "Several sources of this activation provide the contract the module requires: remove all but one, or select one in the seam graph (the requirement's \"select\")."
	}
	return "An implementation dependency (the manifest's dependencies[]) or a required dependency of the seam graph (with its version range) is not met by a source of this activation, or modules depend on each other in a cycle; the message names the range, the version found and the chain."
}

func isDependencyCode(code string) bool {
	return code == reasons.DependencyUnsatisfied || code == reasons.DependencyCycle || code == reasons.DependencyConflict
}

func describePhase(ms iteronv1.ModuleStatus) string {
	if ms.Phase == "" {
		return string(iteronv1.PhaseInactive)
	}
	if ms.GenerationName != "" {
		return fmt.Sprintf("%s, generation %s", ms.Phase, ms.GenerationName)
	}
	return string(ms.Phase)
}

// generationsOf returns the module's active Generation and its newest
// other one that is not older than the active (the failed or in-progress
// target).
func (d *diagnosis) generationsOf(module, activeName string) (active, target *GenerationSummary) {
	var act *iteronv1.Generation
	var newest *iteronv1.Generation
	for i := range d.in.Generations {
		g := &d.in.Generations[i]
		if g.Spec.Module != module {
			continue
		}
		if g.Name == activeName {
			act = g
			continue
		}
		if newest == nil || generationLess(newest, g) {
			newest = g
		}
	}
	if act != nil {
		active = summarizeGeneration(act)
		active.Receipts = d.citeReceipts(act)
	}
	if newest != nil && (act == nil || generationLess(act, newest)) {
		target = summarizeGeneration(newest)
		target.Receipts = d.citeReceipts(newest)
	}
	return active, target
}

// maxCitedReceipts bounds the receipts the doctor quotes per generation.
const maxCitedReceipts = 5

// citeReceipts cites a Failed generation's receipts: from the receipts file
// when the doctor read the node's state dir, else the counts in its status.
// nil for a generation that is not Failed, or has no receipt at all.
func (d *diagnosis) citeReceipts(g *iteronv1.Generation) *ReceiptsCitation {
	if g.Status.Phase != iteronv1.PhaseFailed {
		return nil
	}
	c := &ReceiptsCitation{Source: "status",
		Command: fmt.Sprintf("kubectl iteron receipts %s -n %s --module %s", d.act.Name, d.act.Namespace, g.Spec.Module)}
	if d.local != nil && d.local.Receipts != nil {
		c.Source = "file"
		c.Command += " --state-dir " + d.local.StateDir
		sum, ok := d.local.Receipts.Summaries[g.Name]
		if !ok {
			return nil
		}
		c.Total, c.Irreversible, c.ReversibleRuns = sum.Total, sum.Irreversible, sum.ReversibleRuns
		c.Incomplete, c.IncompleteReason = sum.Truncated, sum.IncompleteReason
		rs := d.local.Receipts.Receipts[g.Name]
		for i := max(0, len(rs)-maxCitedReceipts); i < len(rs); i++ {
			r := rs[i]
			c.Recent = append(c.Recent, fmt.Sprintf("%s %s %s %s compensation=%s: %s", r.ID, r.Kind, r.Class,
				r.FinishedAt.UTC().Format(time.RFC3339), r.Compensation, r.Detail))
		}
		return c
	}
	r := g.Status.Receipts
	if r == nil || (r.Total == 0 && !r.Truncated) {
		return nil
	}
	c.Total, c.Irreversible, c.Incomplete, c.IncompleteReason = int(r.Total), int(r.Irreversible), r.Truncated, r.IncompleteReason
	return c
}

func generationLess(a, b *iteronv1.Generation) bool {
	return cmp.Or(cmp.Compare(a.Spec.Generation, b.Spec.Generation), cmp.Compare(a.Spec.Attempt, b.Spec.Attempt)) < 0
}

func summarizeGeneration(g *iteronv1.Generation) *GenerationSummary {
	txn := ""
	if g.Status.Ledger != nil {
		txn = g.Status.Ledger.TransactionID
	}
	gs := &GenerationSummary{
		TransactionID: txn,
		Name:          g.Name, Lineage: g.Spec.Generation, Attempt: g.Spec.Attempt,
		ImplementationID: g.Spec.Implementation.ID, Version: g.Spec.Implementation.Version,
		Phase: string(g.Status.Phase), Step: string(g.Status.Step), Pid: g.Status.Pid,
		Reason: g.Status.Reason, Message: g.Status.Message,
		StderrTail: g.Status.StderrTail, StderrDroppedBytes: g.Status.StderrDroppedBytes, Renewals: g.Status.Renewals,
	}
	if sb := g.Status.Sandbox; sb != nil {
		gs.Sandbox = sandboxLine(sb)
		gs.SandboxViolations = sb.Violations
	}
	return gs
}

// sandboxLine is a Generation's status.sandbox as the ledger's note says it.
func sandboxLine(sb *iteronv1.SandboxStatus) string {
	lvl, _ := sandbox.ParseLevel(sb.Level)
	return sandbox.Evidence{
		Mode: sandbox.Mode(sb.Mode), Level: lvl, Namespaces: sb.Namespaces, Network: sandbox.Network(sb.Network), Exec: sb.Exec,
		Limits:  sandbox.Limits{MemoryBytes: sb.MemoryBytes, CPUMillis: sb.CPUMillis, Tasks: sb.Tasks, TmpBytes: sb.TmpBytes},
		Cgroups: sb.Cgroups, Seccomp: sb.Seccomp, Landlock: int(sb.Landlock), Launcher: sb.Launcher,
	}.String()
}

// lastBlock is the module's last blocked record: from the ledger file when
// it was read, else from the records status mirrors (the last 16; a block
// older than those is not in view).
func (d *diagnosis) lastBlock(module string) *LedgerBlock {
	if d.local != nil && d.local.Ledger != nil && d.local.Ledger.LastBlocks != nil {
		if b, ok := d.local.Ledger.LastBlocks[module]; ok {
			return &b
		}
		if d.local.Ledger.Broken == nil && d.local.Ledger.Err == "" {
			return nil // the whole ledger was read: there is none
		}
	}
	ls := d.act.Status.Ledger
	if ls == nil {
		return nil
	}
	var b *LedgerBlock
	for _, r := range ls.Recent {
		if r.Module != module {
			continue
		}
		switch r.Outcome {
		case string(ledger.OutcomeBlocked):
			b = &LedgerBlock{Source: "status", Sequence: r.Sequence, TransactionID: r.TransactionID, Phase: r.Phase, Reason: r.Reason}
			if code, _, ok := strings.Cut(r.Reason, ": "); ok {
				if kind, ok := ledger.BlockKindOf(ledger.ReasonCode(code)); ok {
					b.BlockKind = string(kind)
				}
			}
		case string(ledger.OutcomeRolledBack), string(ledger.OutcomeRollbackFailed):
			if b != nil && b.TransactionID == r.TransactionID {
				b.Ending = r.Outcome
			}
		case string(ledger.OutcomeCommitted):
			b = nil // a later transaction of the module committed
		}
	}
	return b
}

// ledger reports the ledger: the file on the node when it was read, else
// what status mirrors.
func (d *diagnosis) ledger() {
	ls := d.act.Status.Ledger
	if d.local != nil && d.local.Ledger != nil {
		ll := d.local.Ledger
		ld := &LedgerDiagnosis{Source: "file", Path: ll.Dir}
		switch {
		case ll.Missing:
			ld.Missing = true
			if ls != nil && ls.Records > 0 {
				ld.Error = ll.Err
				d.add(Finding{Code: FindingLedgerUnreadable, Severity: SeverityProblem,
					Summary: fmt.Sprintf("status mirrors a ledger of %d records but %s does not exist", ls.Records, ll.Dir),
					Hint:    "Check that --state-dir is the manager's state directory on node " + d.act.Spec.NodeName + " (the manager's --state-dir flag)."})
			}
		case ll.Broken != nil:
			re := ll.Broken
			ld.Rule, ld.Sequence, ld.File, ld.Line, ld.Error = string(re.Rule), re.Sequence, re.File, re.Line, ll.Err
			d.add(Finding{Code: FindingLedgerCorrupt, Severity: SeverityProblem,
				Summary: fmt.Sprintf("the ledger %s does not verify: rule %s at sequence %d: %s", ll.Dir, re.Rule, re.Sequence, re.Detail),
				Hint:    fmt.Sprintf("Nothing was repaired. `kubectl iteron ledger verify %s` shows the same; the manager refuses to act on this activation (ledger_corrupt) until an operator resolves it, and deleting the activation archives the ledger.", ll.Dir)})
		case ll.Err != "":
			ld.Error = ll.Err
			d.add(Finding{Code: FindingLedgerUnreadable, Severity: SeverityProblem, Summary: "the ledger could not be read: " + ll.Err})
		default:
			st := ll.State
			ld.Records, ld.HeadSHA256, ld.Verified = int64(st.NextSequence), st.HeadSHA256, true
			if st.Open != nil {
				ld.OpenTransaction = fmt.Sprintf("%s (%s, applied %v)", st.Open.Identity.TransactionID, st.Open.Identity.Module, st.Open.Applied)
			}
		}
		d.r.Ledger = ld
		return
	}
	if ls == nil {
		return
	}
	d.r.Ledger = &LedgerDiagnosis{Source: "status", Path: ls.File, Records: ls.Records, HeadSHA256: ls.HeadSHA256, Verified: ls.Verified}
	if !ls.Verified {
		msg := "status says the ledger did not verify when the manager last opened it"
		if c := d.condition(iteronv1.ConditionStalled); c != nil && c.Reason == iteronv1.ReasonLedgerCorrupt {
			msg += ": " + c.Message
		}
		d.add(Finding{Code: FindingLedgerCorrupt, Severity: SeverityProblem, Summary: msg,
			Hint: "Run the doctor on node " + d.act.Spec.NodeName + " with --state-dir to see the broken rule and sequence."})
	}
}

// receipts reports a receipts file on the node that could not be read, and
// each line of it that could not: what those lines held is lost, the other
// receipts are still cited.
func (d *diagnosis) receipts() {
	if d.local == nil || d.local.Err != "" {
		return
	}
	if d.local.ReceiptsErr != "" {
		d.add(Finding{Code: FindingReceiptsUnreadable, Severity: SeverityProblem,
			Summary: "the receipts file could not be read: " + d.local.ReceiptsErr,
			Hint:    "The Generations' status.receipts still count what the manager recorded."})
		return
	}
	if d.local.Receipts == nil {
		return
	}
	for _, u := range d.local.Receipts.Unreadable {
		d.add(Finding{Code: FindingReceiptsUnreadable, Severity: SeverityProblem,
			Summary: fmt.Sprintf("receipts file %s, %s: skipped; the receipts it held are lost, the other lines were read", d.local.Receipts.Path, u),
			Hint:    "A manager that opens the file marks every generation in it incomplete, naming the line."})
	}
}

// processes attributes each live recorded provider group to the Generation
// whose status shows its pid, and reports the groups no status claims.
func (d *diagnosis) processes() {
	if d.local == nil {
		return
	}
	if d.local.Err != "" {
		d.add(Finding{Code: FindingStateDirUnreadable, Severity: SeverityProblem,
			Summary: fmt.Sprintf("--state-dir %s could not be read: %s", d.local.StateDir, d.local.Err),
			Hint:    "Run the doctor on the node, as a user that can read the manager's state directory."})
		return
	}
	if d.local.ProcessesErr != "" {
		d.add(Finding{Code: FindingStateDirUnreadable, Severity: SeverityProblem,
			Summary: "the process records could not be read: " + d.local.ProcessesErr})
	}
	view := d.in.NodeView
	if view == nil {
		view = &NodeView{Activations: []iteronv1.ImplementationActivation{*d.act}, Generations: d.in.Generations, Scope: d.act.Namespace}
	}
	byUID := map[string]*iteronv1.ImplementationActivation{}
	for i := range view.Activations {
		byUID[string(view.Activations[i].UID)] = &view.Activations[i]
	}
	scope := ""
	if view.Scope != "cluster" {
		scope = fmt.Sprintf(" (only namespace %s could be read: a Generation of another namespace may claim it)", view.Scope)
	}
	for _, p := range d.local.Processes {
		pd := ProcessDiagnosis{File: p.File, Pid: p.Record.PID, Pgid: p.Record.PGID, StartTime: p.Record.StartTime,
			Module: p.Record.Module, ImplementationID: p.Record.ImplementationID, Alive: p.Alive, AgeSeconds: int64(p.Age / time.Second)}
		switch {
		case p.ReadErr != "":
			pd.Verdict = VerdictUnreadable
			d.add(Finding{Code: FindingStaleProcessRecord, Severity: SeverityInfo,
				Summary: fmt.Sprintf("process record %s is unreadable: %s (the manager's sweep removes it at its next start)", p.File, p.ReadErr)})
		case !p.Alive:
			pd.Verdict = VerdictStale
			d.add(Finding{Code: FindingStaleProcessRecord, Severity: SeverityInfo,
				Summary: fmt.Sprintf("process record %s names no live provider: %s; the manager that wrote it did not remove it (its sweep does at the next start)", p.File, p.Gone)})
		default:
			d.judgeLive(&pd, p, view, byUID, scope)
		}
		d.r.Processes = append(d.r.Processes, pd)
	}
}

func (d *diagnosis) judgeLive(pd *ProcessDiagnosis, p LocalProcess, view *NodeView, byUID map[string]*iteronv1.ImplementationActivation, scope string) {
	var claim *iteronv1.Generation
	if p.Members == nil {
		for i := range view.Generations {
			g := &view.Generations[i]
			if g.Status.Pid == int64(p.Record.PID) && g.Spec.NodeName == d.act.Spec.NodeName {
				claim = g
				break
			}
		}
	}
	group := fmt.Sprintf("provider group %d (leader pid %d, module %s, implementation %s)", p.Record.PGID, p.Record.PID, p.Record.Module, p.Record.ImplementationID)
	if p.Members != nil {
		group += "; " + p.Gone
	}
	orphan := Finding{Code: FindingOrphanedProcess, Severity: SeverityProblem, Module: p.Record.Module,
		Hint:     fmt.Sprintf("Its identity (pid, pgid, start time %d, boot) was checked against /proc just now. Stop the group, then remove its record so the next sweep does not look for it.", p.Record.StartTime),
		Commands: []string{fmt.Sprintf("kill -- -%d", p.Record.PGID), "rm -f " + shellQuote(p.File)}}
	if claim == nil {
		if p.Members == nil && d.opts.OrphanGrace > 0 && p.Age < d.opts.OrphanGrace {
			pd.Verdict = VerdictUnconfirmed
			d.add(Finding{Code: FindingUnconfirmedProcess, Severity: SeverityInfo, Module: p.Record.Module,
				Summary: fmt.Sprintf("%s started %s ago and no status shows it yet%s: a transaction in progress, most likely; run the doctor again", group, p.Age.Round(time.Second), scope)})
			return
		}
		pd.Verdict = VerdictOrphaned
		orphan.Summary = fmt.Sprintf("%s is alive but no Generation's status shows its pid%s: it is orphaned", group, scope)
		d.add(orphan)
		return
	}
	pd.ClaimedBy = claim.Namespace + "/" + claim.Name
	owner := metav1.GetControllerOf(claim)
	var act *iteronv1.ImplementationActivation
	if owner != nil {
		act = byUID[string(owner.UID)]
	}
	switch {
	case claim.Status.Phase == iteronv1.PhasePreparing || claim.Status.Phase == iteronv1.PhaseDraining:
		pd.Verdict = VerdictInTransaction
	case claim.Status.Phase == iteronv1.PhaseActive && act != nil && activeIn(act, claim):
		pd.Verdict = VerdictServing
	default:
		pd.Verdict = VerdictOrphaned
		why := fmt.Sprintf("its Generation %s is %s", pd.ClaimedBy, cmp.Or(string(claim.Status.Phase), "without a phase"))
		switch {
		case act == nil:
			why += " and its activation is gone"
		case !activeIn(act, claim):
			why += fmt.Sprintf(" and activation %s/%s does not show it serving module %s", act.Namespace, act.Name, claim.Spec.Module)
		}
		orphan.Summary = fmt.Sprintf("%s is alive but %s: it is orphaned", group, why)
		d.add(orphan)
	}
}

func activeIn(act *iteronv1.ImplementationActivation, g *iteronv1.Generation) bool {
	for _, ms := range act.Status.Modules {
		if ms.Module == g.Spec.Module {
			return ms.GenerationName == g.Name && ms.Phase == iteronv1.PhaseActive
		}
	}
	return false
}

func (d *diagnosis) events() {
	for _, e := range d.in.Events {
		d.r.Events = append(d.r.Events, EventSummary{Time: eventTime(e), Type: e.Type, Reason: e.Reason, Message: e.Message, Count: max(e.Count, 1)})
	}
}

// eventTime is when an event last happened, whichever API wrote it.
func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// summarize adds the conditions' word where nothing more specific was
// found, the paused note, and decides health.
func (d *diagnosis) summarize() {
	problems := d.r.Problems()
	ready := d.condition(iteronv1.ConditionReady)
	readyNow := ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration >= d.act.Generation
	if stalled := d.condition(iteronv1.ConditionStalled); problems == 0 && stalled != nil && stalled.Status == metav1.ConditionTrue {
		d.add(Finding{Code: FindingStalled, Severity: SeverityProblem,
			Summary: fmt.Sprintf("Stalled (%s): %s", stalled.Reason, stalled.Message),
			Hint:    "The manager will not progress without a change: change the spec, or request a retry."})
	} else if problems == 0 && !readyNow && d.r.Deleting == nil {
		f := Finding{Code: FindingNotReady, Severity: SeverityProblem, Summary: "Ready is not True for the current spec"}
		if ready != nil {
			f.Summary = fmt.Sprintf("Ready is %s (%s): %s", ready.Status, ready.Reason, ready.Message)
		}
		switch rec := d.condition(iteronv1.ConditionReconciling); {
		case d.act.Spec.Paused:
			f.Hint = "spec.paused is true: the manager does not apply the current spec (pausing is itself a spec change), so Ready stays False while paused; running providers keep serving. Unpause to let the manager apply the spec:"
			f.Commands = []string{d.unpauseCommand()}
		case rec != nil && rec.Status == metav1.ConditionTrue:
			f.Hint = "A transaction is in progress (Reconciling is True); run the doctor again in a few seconds."
		}
		d.add(f)
	}
	if d.act.Spec.Paused {
		d.add(Finding{Code: FindingPaused, Severity: SeverityInfo,
			Summary:  "spec.paused is true: the manager does not act on spec changes; running providers keep serving",
			Commands: []string{d.unpauseCommand()}})
	}
	slices.SortStableFunc(d.r.Findings, func(a, b Finding) int {
		return cmp.Compare(severityRank(a.Severity), severityRank(b.Severity))
	})
	d.r.Healthy = d.r.Problems() == 0 && readyNow && d.r.ActiveCount == d.r.ModuleCount && len(d.r.Modules) == 0
}

// shellQuote quotes a path for a POSIX shell unless it is made only of
// characters that need none: a printed command is pasted into a shell.
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+,:@=", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func severityRank(s Severity) int {
	if s == SeverityProblem {
		return 0
	}
	return 1
}
