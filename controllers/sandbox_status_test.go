package controllers

import (
	"strconv"
	"testing"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

func TestTheSandboxStatusKeepsTheMostFrequentViolationsWithinTheSchemasBound(t *testing.T) {
	v := map[string]int64{}
	for i := 0; i < 100; i++ {
		v["sys"+strconv.Itoa(i)] = int64(i)
	}
	gen := &iteronv1.Generation{}
	mirrorGeneration(gen, hotswap.GenerationStatus{Sandbox: &iteronv1.SandboxStatus{Mode: "audit", Level: "limits", Violations: v}})
	got := gen.Status.Sandbox
	if got == nil || got.Mode != "audit" || len(got.Violations) != maxViolationKinds {
		t.Fatalf("status.sandbox = %+v", got)
	}
	if _, ok := got.Violations["sys99"]; !ok || got.Violations["sys36"] != 36 {
		t.Errorf("kept %v; want the 64 most frequent (sys36 … sys99)", got.Violations)
	}
	if _, ok := got.Violations["sys35"]; ok {
		t.Errorf("kept sys35, one of the least frequent")
	}
	if len(v) != 100 {
		t.Errorf("the coordinator's map was changed")
	}
}
