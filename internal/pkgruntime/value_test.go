package pkgruntime

import (
	"math"
	"strings"
	"testing"

	caminopb "iteron.dev/operator/api/quixos/camino"
)

func TestJSONAndValuesMapBothWays(t *testing.T) {
	cases := []struct {
		name, in, out string
		kind          string
	}{
		{"null is a null_value", `null`, `null`, "*caminopb.Value_NullValue"},
		{"true is a bool_value", `true`, `true`, "*caminopb.Value_BoolValue"},
		{"an integer within int64 is an int_value", `-9223372036854775808`, `-9223372036854775808`, "*caminopb.Value_IntValue"},
		{"an integer past int64 is a float_value", `9223372036854775808`, `9.223372036854776e18`, "*caminopb.Value_FloatValue"},
		{"a fraction is a float_value", `1.5`, `1.5`, "*caminopb.Value_FloatValue"},
		{"an exponent makes a float_value even when whole", `1e2`, `100.0`, "*caminopb.Value_FloatValue"},
		{"a string is a string_value, escaped as strictjson writes it", `"a\u2028\"b"`, "\"a\u2028\\\"b\"", "*caminopb.Value_StringValue"},
		{"an array is a list_value", `[1,"x",[]]`, `[1,"x",[]]`, "*caminopb.Value_ListValue"},
		{"an object is a map_value, rendered with sorted names", `{"b":1,"a":{"c":null}}`, `{"a":{"c":null},"b":1}`, "*caminopb.Value_MapValue"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := ValueFromJSON([]byte(c.in), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if got := typeName(v.GetKind()); got != c.kind {
				t.Fatalf("kind %s, want %s", got, c.kind)
			}
			out, err := ValueToJSON(v)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != c.out {
				t.Fatalf("rendered %s, want %s", out, c.out)
			}
		})
	}
}

func typeName(k any) string {
	switch k.(type) {
	case *caminopb.Value_NullValue:
		return "*caminopb.Value_NullValue"
	case *caminopb.Value_BoolValue:
		return "*caminopb.Value_BoolValue"
	case *caminopb.Value_IntValue:
		return "*caminopb.Value_IntValue"
	case *caminopb.Value_FloatValue:
		return "*caminopb.Value_FloatValue"
	case *caminopb.Value_StringValue:
		return "*caminopb.Value_StringValue"
	case *caminopb.Value_ListValue:
		return "*caminopb.Value_ListValue"
	case *caminopb.Value_MapValue:
		return "*caminopb.Value_MapValue"
	}
	return "?"
}

func TestBytesRenderAsBase64AndAnEmptyValueAsNull(t *testing.T) {
	out, err := ValueToJSON(&caminopb.Value{Kind: &caminopb.Value_BytesValue{BytesValue: []byte{0, 1, 0xff}}})
	if err != nil || string(out) != `"AAH/"` {
		t.Fatalf("bytes rendered %s, %v; want \"AAH/\"", out, err)
	}
	for _, v := range []*caminopb.Value{nil, {}} {
		if out, err := ValueToJSON(v); err != nil || string(out) != "null" {
			t.Fatalf("%v rendered %s, %v; want null", v, out, err)
		}
	}
}

func TestWhatJSONCannotCarryIsRefused(t *testing.T) {
	deep := strings.Repeat("[", MaxValueDepth+2) + strings.Repeat("]", MaxValueDepth+2)
	inputs := []struct{ name, in, says string }{
		{"a duplicate name at depth is refused", `{"a":{"b":1,"b":2}}`, "duplicate"},
		{"trailing data is refused", `1 2`, "after top-level value"},
		{"invalid UTF-8 is refused", "\"\xff\"", "UTF-8"},
		{"input over its bound is refused", `"` + strings.Repeat("x", 64) + `"`, "exceeds"},
		{"nesting past the bound is refused", deep, "nested deeper than 64"},
	}
	for _, c := range inputs {
		t.Run(c.name, func(t *testing.T) {
			max := 1 << 20
			if strings.Contains(c.name, "bound is refused") && !strings.Contains(c.name, "nesting") {
				max = 32
			}
			_, err := ValueFromJSON([]byte(c.in), max)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("error %v, want one saying %q", err, c.says)
			}
		})
	}
	outputs := []struct {
		name string
		v    *caminopb.Value
		says string
	}{
		{"NaN is refused", &caminopb.Value{Kind: &caminopb.Value_FloatValue{FloatValue: math.NaN()}}, "no JSON form"},
		{"infinity is refused", &caminopb.Value{Kind: &caminopb.Value_FloatValue{FloatValue: math.Inf(1)}}, "no JSON form"},
		{"an invalid UTF-8 string is refused", &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: "\xff"}}, "not valid UTF-8"},
	}
	for _, c := range outputs {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ValueToJSON(c.v); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("error %v, want one saying %q", err, c.says)
			}
		})
	}
	if _, err := MapFromJSON([]byte(`[1]`), 1<<10); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Fatalf("an array as input: %v", err)
	}
}
