package graph

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"iteron.dev/operator/internal/catalog"
)

// builtinGraphSHA256 is the digest of the built-in graph file
// (internal/catalog/seamgraph.json) as the family ships it.
const builtinGraphSHA256 = "63be6cb11dfc3abe2ae297758617d2000dbed1435b7e0ce1bd880e84fbb358d6"

// pinnedEpochs are the epochs the 28-module family graph yields for the
// activation of familyNodes, computed before typed requirements existed
// (main 4487490). An operator upgrade that changed one would reload every
// module of every node.
var pinnedEpochs = map[string]string{
	"prompt_system":           "sha256:1944f9cff3099d313ef5668d1e3d5688b60ba20f228403532c2f0edb1fb855a7",
	"prompt_tool_description": "sha256:55e6ac77ddf652ac61a42debadd97cd48cf3f52aa7de77dce6fba111477fef3f",
	"prompt_subagent":         "sha256:40d513764f18666ebfa97443e41bc47639f7dbd2f39ea4a7295cfc0e9db065b1",
	"prompt_skill":            "sha256:4fae1fa645eccbd708d06598db9e69f6f4eda7a51a8c5e6d7d28c7984ca5ffcd",
	"prompt_compaction":       "sha256:a2304c4f7dc2bdaf3445b29336b5bd694b9e8ca78ca8a15315d2f5a22c2e8bc8",
	"prompt_verification":     "sha256:d9a8490a6afde89897a79e6daf278279b2fb5f205efafa48b4f3d9e9bc3fd125",
	"prompt_planner":          "sha256:ec0d6bf142086c6e7f330a8ba924efb646e5e53e3d7e2cf7b7ffd2cb2e87263c",
	"prompt_memory_write":     "sha256:fe43f93b2c0f574c28cffdf94b8c942e1f293fcd1339d00e1f83c549e2757e87",
	"prompt_reduce":           "sha256:1649f4e8e7f48b7cf4681923a637d58173dcd9dee9974162eb9ee44dd5211146",
	"prompt_recovery":         "sha256:b90ff35c568ddf3cba18fa3dbceab21ad83a5c1c6a8c435b46df13252e52cc13",
	"context_assembly":        "sha256:a6bc843d0fbca20ecc50e45527945154d0c75b5ac9b5db15ed9af53708e85988",
	"context_compaction":      "sha256:5974a0c01c1e523f998c91328a64decfe375f6e2303cffff13e652ece0612c6a",
	"memory_recall":           "sha256:b871b41ef6cfdedf15ecd042cbf36b8188a1a12597b7eb521b11e08376b111cf",
	"tool_exposure":           "sha256:5198190ee64ea87f441d7dd5dd84ecdac90aa53f7daa3ab2b80ae1904ea66878",
	"tool_arguments":          "sha256:6f803eafc23caf70c22c7692a62cce52ea3535772f4509c73a72ac643eb5b8fc",
	"tool_edit_strategy":      "sha256:1bc008485beee35d698fc5e2d84cf969f0b318563d38b2021240288f4811a94a",
	"tool_search_strategy":    "sha256:810e036649348f02e1e334ef83ca68b728ff5738bad86d7982a630a6091b711d",
	"provider_routing":        "sha256:94d7ca04a788f12d20e07fb7c18e18fc5aacfbd9a9d5158a946466f74887cdfd",
	"provider_sampling":       "sha256:2e0318b6d731d9ace7a3ab9703356768ae74906a6893a980510d3978b102fe6b",
	"provider_retry":          "sha256:c9c1f99a8e086f08648da0e5054ce713c93ad5af280e1d9108b9f8aad7002582",
	"provider_prompt_cache":   "sha256:d821167ba3590ef9650e5bb5f8a3fa91c47efe3f8c1106581aed113d79a6d61c",
	"scheduler_parallelism":   "sha256:ac69665d28e67f05ba154fa35141885094f5043520c9b87fd8a3c135336ef5b7",
	"planner_fanout":          "sha256:9d3f30e4cb5346f03fea8b0ada21720f106d91f467359c648e05ba45333f43f3",
	"verification_quorum":     "sha256:21a05da9269760ffceaa6e3bf405b4e5e4a2fe11629d5f0a4c49e7f8d0e8dedc",
	"budget_allocation":       "sha256:42913667999170dfba398d89416576480cd6b18975fb5e1971ef28f586b0f1c6",
	"session_stop":            "sha256:ca986ec8bdc4993a2fab87798839b7795896603187a96a8663285e2df73eab06",
	"session_checkpoint":      "sha256:1483d7c7649791536b763031ad56499b6450aaff95d7efb1e87240751a3d4196",
	"session_fork":            "sha256:ada798060f11605d988108abec7dc19da934adb70922771dc431bdbe21f91c39",
}

// familyNodes fills every module of the built-in graph (version 1.i.0,
// artifact byte i+1); session_fork also depends on prompt_system's
// implementation, so an implementation dependency is pinned too.
func familyNodes() []Node {
	var nodes []Node
	for i, m := range catalog.BuiltinSeamGraph().Modules() {
		n := node(m, "family-"+m, catalog.Version{1, uint64(i), 0}, byte(i+1))
		if m == "session_fork" {
			n.Dependencies = []catalog.Dependency{dep("family-prompt_system", v1)}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func TestTheFamilyGraphAndItsEpochsAreByteIdenticalAcrossOperatorVersions(t *testing.T) {
	sum := sha256.Sum256(catalog.BuiltinSeamGraphJSON())
	if got := hex.EncodeToString(sum[:]); got != builtinGraphSHA256 {
		t.Errorf("the built-in graph file changed: sha256 %s, pinned %s", got, builtinGraphSHA256)
	}
	ev := evaluate(t, familyNodes())
	if len(ev.Modules) != catalog.BuiltinModuleCount {
		t.Fatalf("%d modules evaluated, want %d", len(ev.Modules), catalog.BuiltinModuleCount)
	}
	for _, s := range ev.Modules {
		if !s.Admitted {
			t.Errorf("%s not admitted: %s %s", s.Module, s.Reason, s.Message)
		}
		if want := pinnedEpochs[s.Module]; s.Epoch != want {
			t.Errorf("epoch of %s = %s, pinned %s", s.Module, s.Epoch, want)
		}
		if len(s.Diagnostics) != 0 {
			t.Errorf("%s has diagnostics %q under the built-in graph", s.Module, s.Diagnostics)
		}
	}
}
