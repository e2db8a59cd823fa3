package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const (
	repoCRDs      = "../../config/crd/bases"
	repoReference = "../../docs/reference/api.md"
)

func renderRepo(t *testing.T) []byte {
	t.Helper()
	crds, err := loadCRDs(repoCRDs)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := render(crds)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestCommittedReferenceIsWhatTheCRDsGenerate fails when a marker changed the
// CRDs and docs/reference/api.md was not regenerated (`make api-docs`).
func TestCommittedReferenceIsWhatTheCRDsGenerate(t *testing.T) {
	committed, err := os.ReadFile(repoReference)
	if err != nil {
		t.Fatalf("%v (generate it with `make api-docs`)", err)
	}
	if doc := renderRepo(t); !bytes.Equal(committed, doc) {
		t.Fatalf("docs/reference/api.md is stale: it first differs from what config/crd/bases generates at line %d; run `make api-docs`",
			firstDifferentLine(committed, doc))
	}
}

// TestRenderingIsDeterministic renders the same CRDs repeatedly: map
// iteration order is random in Go, so an unsorted walk would show here.
func TestRenderingIsDeterministic(t *testing.T) {
	first := renderRepo(t)
	for range 20 {
		if again := renderRepo(t); !bytes.Equal(first, again) {
			t.Fatalf("two renderings differ at line %d", firstDifferentLine(first, again))
		}
	}
}

// tableRows parses the field tables of a rendered reference: kind → field
// path → the cells after the path (type, default, validation, description).
func tableRows(t *testing.T, doc []byte) map[string]map[string][]string {
	t.Helper()
	rows := map[string]map[string][]string{}
	kind := ""
	for _, line := range strings.Split(string(doc), "\n") {
		if k, ok := strings.CutPrefix(line, "## "); ok {
			kind = k
			rows[kind] = map[string][]string{}
			continue
		}
		if kind == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := splitCells(line)
		if len(cells) != 5 {
			continue // a printer column or a rule row
		}
		path := strings.Trim(cells[0], "`")
		if _, dup := rows[kind][path]; dup {
			t.Fatalf("%s: field %s has two rows", kind, path)
		}
		rows[kind][path] = cells[1:]
	}
	return rows
}

// splitCells splits a Markdown table row on unescaped pipes.
func splitCells(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteString(`\|`)
			i++
		case strings.HasPrefix(line[i:], " | "):
			cells = append(cells, cur.String())
			cur.Reset()
			i += 2
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, cur.String())
}

// TestReferenceShowsTypeDefaultValidationAndDescriptionOfFields checks whole
// rows for fields that exercise each kind of cell.
func TestReferenceShowsTypeDefaultValidationAndDescriptionOfFields(t *testing.T) {
	rows := tableRows(t, renderRepo(t))
	cases := []struct {
		name, kind, path string
		want             []string
	}{
		{"an integer with a default and bounds", "ImplementationActivation", "spec.swap.deadlineSeconds",
			[]string{"integer (int32)", "`30`", "minimum 1<br>maximum 3600", "deadlineSeconds bounds one whole transaction; it is checked before each phase."}},
		{"a string enum with a default", "ImplementationActivation", "spec.swap.strategy",
			[]string{"string", "`\"Hot\"`", "one of `Hot`, `Cold`", "strategy is Hot (state migrated; protocol 2 on both sides) or Cold (no state moves)."}},
		{"an object defaulted to {}", "ImplementationActivation", "spec.swap",
			[]string{"object", "`{}`", "", "swap bounds and shapes transactions."}},
		{"a list map keyed by module", "ImplementationActivation", "spec.sources",
			[]string{"[]object", "", "maxItems 64<br>list: map keyed by `module`", "sources select one implementation per module, keyed by module."}},
		{"a set of enum items", "ImplementationActivation", "spec.capabilityCeiling",
			[]string{"[]string", "", "maxItems 5<br>list: set<br>each item: one of `read_only`, `reversible_local`, `code_executing`, `trust_mutating`, `irreversible_external`",
				"capabilityCeiling narrows the node's capability ceiling for this activation; it can never widen it. Empty means the node's ceiling."}},
		{"a required pattern field of a list item", "ImplementationActivation", "spec.sources[].module",
			[]string{"string", "", "required<br>pattern `^[a-z][a-z0-9_]{0,47}$`<br>minLength 1<br>maxLength 48",
				"module is the module this source fills, in snake_case (for example prompt_system). At most one source per module."}},
		{"a CEL rule with pipes, escaped for the table", "ImplementationActivation", "spec.sources[].catalogPath",
			[]string{"string", "", "maxLength 512<br>rule `self.matches('^(/[^/\\\\x00]+)+$') && !self.matches('(^\\|/)[.][.]?(/\\|$)')`: must be an absolute, clean path: no empty, '.' or '..' segment, no trailing '/', not '/' alone",
				"catalogPath is the absolute, canonical path of the catalog file on the node, or of a package-runtime manifest (a file with a top-level schema_id). It must lie under the manager's allowed roots and contain no symlink. Give it with artifactRoot, or give oci instead of both."}},
		{"an immutable field", "ImplementationActivation", "spec.nodeName",
			[]string{"string", "", "required<br>minLength 1<br>maxLength 253<br>rule `self == oldSelf`: nodeName is immutable",
				"nodeName is the node whose manager runs these providers. Immutable: create a new activation to move to another node."}},
		{"an immutable spec", "Generation", "spec",
			[]string{"object", "", "required<br>rule `self == oldSelf`: Generation spec is immutable", "spec is the generation's verified implementation and lineage; immutable."}},
		{"a timestamp", "Generation", "status.activatedAt",
			[]string{"string (date-time)", "", "", "activatedAt is when the generation became Active."}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rows[tc.kind][tc.path]
			if !ok {
				t.Fatalf("no row for %s %s", tc.kind, tc.path)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("%s %s:\n got  %q\n want %q", tc.kind, tc.path, got, tc.want)
			}
		})
	}
}

// schemaPaths lists every field path of a schema, walked independently of
// render.go's walk.
func schemaPaths(prefix string, s apiextensionsv1.JSONSchemaProps, out map[string]bool) {
	for name, p := range s.Properties {
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out[path] = true
		schemaPaths(path, p, out)
	}
	if s.Items != nil && s.Items.Schema != nil && s.Items.Schema.Type == "object" {
		out[prefix+"[]"] = true
		schemaPaths(prefix+"[]", *s.Items.Schema, out)
	}
}

// TestEveryFieldOfTheCRDsHasExactlyOneRow compares the rendered rows with the
// field paths of the schemas, both ways.
func TestEveryFieldOfTheCRDsHasExactlyOneRow(t *testing.T) {
	crds, err := loadCRDs(repoCRDs)
	if err != nil {
		t.Fatal(err)
	}
	rows := tableRows(t, renderRepo(t))
	if len(rows) != len(crds) {
		t.Fatalf("the reference has %d kinds; config/crd/bases has %d CRDs", len(rows), len(crds))
	}
	for _, c := range crds {
		kind := c.crd.Spec.Names.Kind
		want := map[string]bool{}
		schemaPaths("", *c.crd.Spec.Versions[0].Schema.OpenAPIV3Schema, want)
		// The walk reached into spec (every kind has one with fields): a
		// broken walk finds only the top level.
		nested := 0
		for p := range want {
			if strings.HasPrefix(p, "spec.") {
				nested++
			}
		}
		if !want["spec"] || nested == 0 {
			t.Fatalf("%s: %d fields found in the schema, none below spec; the walk is broken", kind, len(want))
		}
		var missing, extra []string
		for p := range want {
			if _, ok := rows[kind][p]; !ok {
				missing = append(missing, p)
			}
		}
		for p := range rows[kind] {
			if !want[p] {
				extra = append(extra, p)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 || len(extra) > 0 {
			t.Fatalf("%s: fields without a row: %v; rows without a field: %v", kind, missing, extra)
		}
		t.Logf("%s: %d fields, each with one row", kind, len(want))
	}
}

// widgetCRD is a small CRD whose spec schema a test chooses.
func widgetCRD(spec apiextensionsv1.JSONSchemaProps) apiextensionsv1.CustomResourceDefinition {
	return apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.dev"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.dev", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Widget", ListKind: "WidgetList", Plural: "widgets", Singular: "widget"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type:       "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": spec},
				}},
			}},
		},
	}
}

func writeCRDs(t *testing.T, crds ...apiextensionsv1.CustomResourceDefinition) string {
	t.Helper()
	dir := t.TempDir()
	for i, c := range crds {
		data, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, string(rune('a'+i))+".yaml"), append([]byte("---\n"), data...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func renderDir(t *testing.T, dir string) ([]byte, error) {
	t.Helper()
	crds, err := loadCRDs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return render(crds)
}

func TestRenderRefusesSchemaKeywordsItCannotShow(t *testing.T) {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	cases := []struct {
		name     string
		spec     apiextensionsv1.JSONSchemaProps
		wantPath string
		keyword  string
	}{
		{"oneOf on a field", apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"size": {Type: "string", OneOf: []apiextensionsv1.JSONSchemaProps{{Pattern: "^a"}, {Pattern: "^b"}}},
		}}, "spec.size", "oneOf"},
		{"anyOf on the spec", apiextensionsv1.JSONSchemaProps{Type: "object", AnyOf: []apiextensionsv1.JSONSchemaProps{{Required: []string{"a"}}}}, "spec", "anyOf"},
		{"an int-or-string anyOf with more than its two types", apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"port": {XIntOrString: true, AnyOf: []apiextensionsv1.JSONSchemaProps{{Type: "integer", Minimum: ptr.To(1.0)}, {Type: "string"}}},
		}}, "spec.port", "anyOf"},
		{"allOf", apiextensionsv1.JSONSchemaProps{Type: "object", AllOf: []apiextensionsv1.JSONSchemaProps{{Required: []string{"a"}}}}, "spec", "allOf"},
		{"not", apiextensionsv1.JSONSchemaProps{Type: "object", Not: &apiextensionsv1.JSONSchemaProps{Required: []string{"a"}}}, "spec", "not"},
		{"patternProperties", apiextensionsv1.JSONSchemaProps{Type: "object", PatternProperties: map[string]apiextensionsv1.JSONSchemaProps{"^x-": str}}, "spec", "patternProperties"},
		{"a title", apiextensionsv1.JSONSchemaProps{Type: "object", Title: "Spec"}, "spec", "title"},
		{"an example on a list item", apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"tags": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string", Example: &apiextensionsv1.JSON{Raw: []byte(`"x"`)}}}},
		}}, "spec.tags[]", "example"},
		{"tuple items", apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"pair": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{JSONSchemas: []apiextensionsv1.JSONSchemaProps{str, str}}},
		}}, "spec.pair", "items (as a list of schemas)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderDir(t, writeCRDs(t, widgetCRD(tc.spec)))
			var ue *unshownKeywordError
			if !errors.As(err, &ue) {
				t.Fatalf("error = %v; want an unshown keyword error", err)
			}
			if ue.path != tc.wantPath || ue.keyword != tc.keyword || ue.version != "v1" || filepath.Base(ue.file) != "a.yaml" {
				t.Fatalf("error = %v; want field %s, keyword %s in a.yaml version v1", err, tc.wantPath, tc.keyword)
			}
		})
	}
}

func TestRenderEscapesTableSyntaxAndShowsEveryConstraint(t *testing.T) {
	min0, max9 := 0.0, 9.5
	spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"odd": {
			Type:        "string",
			Description: "a | b <tag> and `x|y<z>`\nsame paragraph\n\nsecond paragraph",
			Pattern:     "^(a|b)`$",
			Nullable:    true,
		},
		"ratio": {Type: "number", Minimum: &min0, ExclusiveMinimum: true, Maximum: &max9, MultipleOf: ptr.To(0.5)},
		"labels": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &apiextensionsv1.JSONSchemaProps{Type: "string", MaxLength: ptr.To[int64](63)}},
			MaxProperties: ptr.To[int64](8), XMapType: ptr.To("granular")},
		"share": {XIntOrString: true, AnyOf: []apiextensionsv1.JSONSchemaProps{{Type: "integer"}, {Type: "string"}}},
		"port":  {XIntOrString: true, XValidations: apiextensionsv1.ValidationRules{{Rule: "self != 0", MessageExpression: "'got ' + string(self)", FieldPath: ".port", Reason: ptr.To(apiextensionsv1.FieldValueForbidden)}}},
		"raw":   {Type: "object", XPreserveUnknownFields: ptr.To(true)},
	}}
	doc, err := renderDir(t, writeCRDs(t, widgetCRD(spec)))
	if err != nil {
		t.Fatal(err)
	}
	rows := tableRows(t, doc)["Widget"]
	want := map[string][]string{
		"spec.odd": {"string", "", "nullable<br>pattern ``^(a\\|b)`$``",
			"a \\| b &lt;tag&gt; and `x\\|y<z>` same paragraph<br><br>second paragraph"},
		"spec.ratio":  {"number", "", "exclusiveMinimum 0<br>maximum 9.5<br>multipleOf 0.5", ""},
		"spec.labels": {"map[string]string", "", "maxProperties 8<br>map: granular<br>each value: maxLength 63", ""},
		"spec.port":   {"int or string", "", "rule `self != 0` (message expression `'got ' + string(self)`) (reason FieldValueForbidden) (reported at `.port`)", ""},
		"spec.raw":    {"object (any fields)", "", "", ""},
		"spec.share":  {"int or string", "", "", ""},
	}
	for path, w := range want {
		if got := rows[path]; !reflect.DeepEqual(got, w) {
			t.Errorf("%s:\n got  %q\n want %q", path, got, w)
		}
	}
}

func TestLoadRefusesFilesThatAreNotCRDs(t *testing.T) {
	valid, err := yaml.Marshal(widgetCRD(apiextensionsv1.JSONSchemaProps{Type: "object"}))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, content, wantErr string
	}{
		{"a misspelt schema keyword", strings.Replace(string(valid), "type: object", "typo: object", 1), `unknown field`},
		{"a duplicate key", strings.Replace(string(valid), "scope: Namespaced", "scope: Namespaced\n  scope: Cluster", 1), `duplicate`},
		{"a Deployment", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n", "not an apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{"a second document that is not a CRD", string(valid) + "---\napiVersion: v1\nkind: ConfigMap\n", "document 2 is v1 ConfigMap"},
		{"no CRD at all", "---\n", "no CustomResourceDefinition"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "crd.yaml"), []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := loadCRDs(dir)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v; want one containing %q", err, tc.wantErr)
			}
			if tc.wantErr != "no CustomResourceDefinition" && !strings.Contains(err.Error(), "crd.yaml") {
				t.Fatalf("error = %v; want it to name the file", err)
			}
		})
	}
}

func TestCommandChecksWritesAndRefusesBadUsage(t *testing.T) {
	crds := writeCRDs(t, widgetCRD(apiextensionsv1.JSONSchemaProps{Type: "object", Description: "the widget"}))
	out := filepath.Join(t.TempDir(), "ref", "api.md")
	steps := []struct {
		name       string
		args       []string
		wantCode   int
		wantOutput string
	}{
		{"-check fails when the reference does not exist", []string{"-crds", crds, "-out", out, "-check"}, 1, "is stale"},
		{"writing creates the reference", []string{"-crds", crds, "-out", out}, 0, "wrote " + out + " (1 kinds"},
		{"-check passes on what was just written", []string{"-crds", crds, "-out", out, "-check"}, 0, "is up to date"},
		{"an unknown flag is a usage error", []string{"-crd", crds}, 2, "flag provided but not defined"},
		{"a stray argument is a usage error", []string{"-crds", crds, "extra"}, 2, "unexpected arguments"},
		{"a directory without CRDs fails", []string{"-crds", t.TempDir(), "-out", out}, 1, "no CustomResourceDefinition"},
	}
	for _, s := range steps {
		var stdout, stderr bytes.Buffer
		code := run(s.args, &stdout, &stderr)
		if code != s.wantCode || !strings.Contains(stdout.String()+stderr.String(), s.wantOutput) {
			t.Fatalf("%s: exit %d, output %q; want exit %d and %q", s.name, code, stdout.String()+stderr.String(), s.wantCode, s.wantOutput)
		}
	}
	if err := os.WriteFile(out, []byte("edited by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := run([]string{"-crds", crds, "-out", out, "-check"}, &bytes.Buffer{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "first difference at line 1") {
		t.Fatalf("-check on a hand-edited reference: exit %d, %q; want exit 1 naming line 1", code, stderr.String())
	}
}
