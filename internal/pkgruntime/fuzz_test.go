package pkgruntime

import (
	"bytes"
	"testing"
)

// FuzzValueFromJSON checks that the JSON → Value mapping never panics, and
// that whatever it accepts renders to JSON that maps back to a Value
// rendering to the same bytes (the rendering is a fixed point).
func FuzzValueFromJSON(f *testing.F) {
	for _, s := range []string{`null`, `{"key":"a","value":[1,2.5,"x",{"y":null}]}`, `9223372036854775808`, `1e400`, `{"a":1,"a":2}`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ValueFromJSON(data, 1<<16)
		if err != nil {
			return
		}
		out, err := ValueToJSON(v)
		if err != nil {
			t.Fatalf("an accepted value does not render: %v (input %q)", err, data)
		}
		again, err := ValueFromJSON(out, 1<<20)
		if err != nil {
			t.Fatalf("the rendering %s of an accepted value is refused: %v", out, err)
		}
		out2, err := ValueToJSON(again)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("rendering is not a fixed point: %s then %s (%v)", out, out2, err)
		}
	})
}
