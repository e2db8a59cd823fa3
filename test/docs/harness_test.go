package docs

import (
	"strings"
	"testing"
)

// The rules the guides are read by (doc.go), each shown on a small case, so
// that a change to the reader is a change to these first.

func TestASessionBlockSplitsIntoCommandsAndTheirOutput(t *testing.T) {
	bs, err := parseBlocks("intro\n\n<!-- doctest: digests vary -->\n   ```sh\n   $ echo a \\\n     b\n   a b\n   $ cat <<'EOF'\n   $ not a prompt inside a here-document\n   EOF\n   $ true\n   ```\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].Lang != "sh" || bs[0].Directive != "digests vary" || bs[0].Line != 4 {
		t.Fatalf("blocks = %+v", bs)
	}
	cmds, err := commands(bs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []command{
		{Line: 5, Text: "echo a \\\n  b", Output: []string{"a b"}},
		{Line: 8, Text: "cat <<'EOF'\n$ not a prompt inside a here-document\nEOF"},
		{Line: 11, Text: "true"},
	}
	if len(cmds) != len(want) {
		t.Fatalf("commands = %+v", cmds)
	}
	for i := range want {
		if cmds[i].Line != want[i].Line || cmds[i].Text != want[i].Text || strings.Join(cmds[i].Output, "|") != strings.Join(want[i].Output, "|") {
			t.Errorf("command %d = %+v, want %+v", i, cmds[i], want[i])
		}
	}
}

func TestAScriptBlockRunsEveryLineAndComparesNothing(t *testing.T) {
	bs, _ := parseBlocks("```sh\n# a comment\nmkdir x\n\ncd x   # trailing comment\n```\n")
	cmds, err := commands(bs[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 2 || cmds[0].Text != "mkdir x" || cmds[1].Text != "cd x   # trailing comment" || cmds[0].Output != nil {
		t.Fatalf("commands = %+v", cmds)
	}
}

func TestAnUnclosedBlockIsAnError(t *testing.T) {
	if _, err := parseBlocks("```sh\necho\n"); err == nil {
		t.Fatal("an unclosed block was accepted")
	}
}

func TestOutputRules(t *testing.T) {
	d1, d2 := strings.Repeat("a", 64), strings.Repeat("b", 64)
	x1, x2 := strings.Repeat("1", 64), strings.Repeat("2", 64)
	for _, tc := range []struct {
		name     string
		shown    []string
		printed  string
		vary     bool
		mismatch bool
	}{
		{name: "equal text matches", shown: []string{"ok"}, printed: "ok\n"},
		{name: "other text differs", shown: []string{"ok"}, printed: "not ok\n", mismatch: true},
		{name: "runs of blanks match runs of blanks", shown: []string{"a   b"}, printed: "a b\t \n"},
		{name: "a blank does not match nothing", shown: []string{"a b"}, printed: "ab\n", mismatch: true},
		{name: "a duration matches any duration", shown: []string{"load 17.22ms done"}, printed: "load 510µs done\n"},
		{name: "a duration does not match a word", shown: []string{"took 3s"}, printed: "took long\n", mismatch: true},
		{name: "… within a line matches any text", shown: []string{"node …: healthy"}, printed: "node vm-1: healthy\n"},
		{name: "a … line matches any number of lines", shown: []string{"first", "…", "last"}, printed: "first\nx\ny\nlast\n"},
		{name: "a … line matches no line too", shown: []string{"first", "…", "last"}, printed: "first\nlast\n"},
		{name: "a missing line differs", shown: []string{"a", "b"}, printed: "a\n", mismatch: true},
		{name: "an extra line differs", shown: []string{"a"}, printed: "a\nb\n", mismatch: true},
		{name: "digests are exact by default", shown: []string{"sha256:" + d1}, printed: "sha256:" + x1 + "\n", mismatch: true},
		{name: "a varying digest matches any digest", shown: []string{"sha256:" + d1}, printed: "sha256:" + x1 + "\n", vary: true},
		{name: "one shown digest must be one printed digest", shown: []string{d1, d1}, printed: x1 + "\n" + x2 + "\n", vary: true, mismatch: true},
		{name: "two shown digests must be two printed digests", shown: []string{d1, d2}, printed: x1 + "\n" + x1 + "\n", vary: true, mismatch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diff := matchOutput(tc.shown, tc.printed, tc.vary, newDigestMap())
			if (diff != "") != tc.mismatch {
				t.Fatalf("mismatch %v (%s), want %v", diff != "", diff, tc.mismatch)
			}
		})
	}
}

func TestAVaryingDigestKeepsItsValueAcrossCommands(t *testing.T) {
	d, x1, x2 := strings.Repeat("a", 64), strings.Repeat("1", 64), strings.Repeat("2", 64)
	dm := newDigestMap()
	if diff := matchOutput([]string{d}, x1, true, dm); diff != "" {
		t.Fatal(diff)
	}
	if diff := matchOutput([]string{"artifact=sha256:" + d}, "artifact=sha256:"+x2, true, dm); diff == "" {
		t.Fatal("a digest the guide shows as the earlier one matched another")
	}
	if diff := matchOutput([]string{"artifact=sha256:" + d}, "artifact=sha256:"+x1, true, dm); diff != "" {
		t.Fatal(diff)
	}
}

func TestYourValuesAreTheOnlySubstitution(t *testing.T) {
	shown := map[string]string{}
	got, err := substitute([]command{{Line: 1, Text: "export ITERON_DIR=/tmp/iteron   # yours"}}, map[string]string{"ITERON_DIR": "/t/x"}, shown)
	if err != nil || got[0].Text != "export ITERON_DIR='/t/x'   # yours" || shown["/t/x"] != "/tmp/iteron" {
		t.Fatalf("got %+v, %v, shown %v", got, err, shown)
	}
	if _, err := substitute([]command{{Line: 1, Text: "export OTHER=1"}}, map[string]string{}, shown); err == nil {
		t.Fatal("a value the test does not know was accepted")
	}
	if _, err := substitute([]command{{Line: 1, Text: "mkdir /tmp/iteron"}}, map[string]string{}, shown); err == nil {
		t.Fatal("a command that is not an export was accepted in a your-values block")
	}
	if out := unsubstitute("/t/x/providers and /t/x", shown); out != "/tmp/iteron/providers and /tmp/iteron" {
		t.Fatalf("unsubstitute = %q", out)
	}
}

func TestHeadingAnchorsAreGitHubs(t *testing.T) {
	slugs := headingSlugs("# Writing providers\n## The raw protocol, for any language\n### `make demo`\n## The 28 modules\n## By hand: a, b\n```\n# not a heading\n```\n## The 28 modules\n")
	for _, want := range []string{"writing-providers", "the-raw-protocol-for-any-language", "make-demo", "the-28-modules", "by-hand-a-b", "the-28-modules-1"} {
		if !slugs[want] {
			t.Errorf("no anchor %q in %v", want, slugs)
		}
	}
	if slugs["not-a-heading"] {
		t.Error("a comment in a code block was taken for a heading")
	}
}
