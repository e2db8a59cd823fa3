package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSplitRoleTakesTheRoleOutOfTheArguments(t *testing.T) {
	cases := []struct {
		args     []string
		role     string
		rest     []string
		errNames string
	}{
		{[]string{"--node-name=a"}, roleNode, []string{"--node-name=a"}, ""},
		{[]string{"--role=fleet", "--leader-elect=false"}, roleFleet, []string{"--leader-elect=false"}, ""},
		{[]string{"-role", "fleet"}, roleFleet, nil, ""},
		{[]string{"--role=node", "--state-dir=/s"}, roleNode, []string{"--state-dir=/s"}, ""},
		{[]string{"--role=kubelet"}, "", nil, `--role="kubelet": must be node`},
		{[]string{"--role"}, "", nil, "--role=\"\": needs a value"},
	}
	for _, tc := range cases {
		role, rest, err := splitRole(tc.args)
		if tc.errNames != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errNames) {
				t.Errorf("splitRole(%q) error = %v; want it to contain %q", tc.args, err, tc.errNames)
			}
			continue
		}
		if err != nil || role != tc.role || !reflect.DeepEqual(rest, tc.rest) {
			t.Errorf("splitRole(%q) = %q %q %v; want %q %q", tc.args, role, rest, err, tc.role, tc.rest)
		}
	}
}

func TestParseFleetOptionsRefusesBadValuesNamingTheFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"a renew deadline as long as the lease", []string{"--leader-elect-lease-duration=10s", "--leader-elect-renew-deadline=10s"}, "--leader-elect-renew-deadline"},
		{"a retry period as long as the renew deadline", []string{"--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=2s"}, "--leader-elect-retry-period"},
		{"a zero lease", []string{"--leader-elect-lease-duration=0s"}, "--leader-elect-lease-duration"},
		{"a namespace that is not a DNS label", []string{"--leader-election-namespace=Iteron_System"}, "--leader-election-namespace"},
		{"a lease name that is not a DNS subdomain", []string{"--leader-election-id=Fleet!"}, "--leader-election-id"},
		{"a node flag", []string{"--node-name=a"}, "node-name"},
		{"a stray argument", []string{"extra"}, "unexpected arguments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFleetOptions(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseFleetOptions(%q) error = %v; want it to contain %q", tc.args, err, tc.want)
			}
		})
	}
	t.Setenv("POD_NAMESPACE", "")
	o, err := parseFleetOptions(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.leaderElect || o.leaderElectionNamespace != "iteron-system" || o.leaderElectionID != "iteron-fleet" ||
		o.leaseDuration != 15*time.Second || o.renewDeadline != 10*time.Second || o.retryPeriod != 2*time.Second {
		t.Fatalf("defaults: %+v", o)
	}
}

func TestTheFleetRoleRefusesNodeFlags(t *testing.T) {
	var out strings.Builder
	if code := run([]string{"--role=fleet", "--state-dir=/var/lib/x"}, &out); code != exitUsage || !strings.Contains(out.String(), "state-dir") {
		t.Fatalf("exit %d, output %q; want usage error naming state-dir", code, out.String())
	}
}
