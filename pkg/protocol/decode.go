package protocol

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// Decoding is strict and single-pass: the frame is walked once, rejecting
// duplicate names at any depth, invalid UTF-8, unknown and missing members,
// values of the wrong type and trailing data. Raw values (input,
// observation, state) are checked by the same walk and returned as
// sub-slices of the input, never copied or re-encoded: the caller must not
// reuse the input buffer while it holds them.
//
// The walk has two modes sharing every message's code below. The fast mode
// scans the bytes itself with strictjson's scanning steps (the rules of
// strictjson.Check) and gives up at anything unusual: any error, a name
// with an escape, a payload whose tag is not its first member. The full
// mode is jsontext's strict decoder; it runs only when the fast mode gave
// up, and then decides (an accepted frame, or the error that says where and
// why). So the fast mode only has to accept nothing the full mode refuses,
// and decode to the same values: FuzzFastDecoder checks both on every
// input.

// DecodeRequest decodes one host → provider frame (the provider side). It
// checks shape only; Validate checks values.
func DecodeRequest(frame []byte) (*Request, error) {
	if len(frame) > MaxFrameBytes {
		return nil, errorf(ErrTooLarge, "", "frame of %d bytes exceeds %d", len(frame), MaxFrameBytes)
	}
	if r, err := decodeRequest(&decoder{fast: true, src: frame}); err == nil {
		return r, nil
	}
	d := pooledDecoder(frame)
	defer d.release()
	return decodeRequest(d)
}

func decodeRequest(d *decoder) (*Request, error) {
	if err := d.open(""); err != nil {
		return nil, err
	}
	r := new(Request)
	if err := requestFrame.readInto(d, "", "", 0, r); err != nil {
		return nil, err
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return r, nil
}

// DecodeFrame decodes one provider → host line (the host side): a response if
// it is an object with request_id, otherwise an observation
// (docs/reference/protocol.md). It checks shape only; Correlate and
// CheckObservation check values.
func DecodeFrame(frame []byte) (Frame, error) {
	if len(frame) > MaxFrameBytes {
		return Frame{}, errorf(ErrTooLarge, "", "frame of %d bytes exceeds %d", len(frame), MaxFrameBytes)
	}
	if f, err := decodeFrame(&decoder{fast: true, src: frame}); err == nil {
		return f, nil
	}
	d := pooledDecoder(frame)
	defer d.release()
	return decodeFrame(d)
}

func decodeFrame(d *decoder) (Frame, error) {
	if err := d.open(""); err != nil {
		return Frame{}, err
	}
	// One allocation for either result; a member both frames declare is
	// read into the response and copied if the frame is an observation.
	v := new(struct {
		r Response
		o Observation
	})
	u := &frameMembers
	seen, err := d.members("", u.names, 0, func(i int, p string) error {
		if j := u.response[i]; j >= 0 {
			return d.field(responseFrame.members[j].field(&v.r), p)
		}
		return d.field(observationFrame.members[u.observation[i]].field(&v.o), p)
	})
	if err != nil {
		return Frame{}, err
	}
	if err := d.end(); err != nil {
		return Frame{}, err
	}
	if seen&u.mark != 0 {
		if err := onlyMembers("", u.names, seen, u.responseSet, "a response"); err != nil {
			return Frame{}, err
		}
		if err := requireAll("", u.names, seen, u.responseSet); err != nil {
			return Frame{}, err
		}
		return Frame{Response: &v.r}, nil
	}
	if err := onlyMembers("", u.names, seen, u.observationSet, "an observation (a frame without "+responseMark+")"); err != nil {
		return Frame{}, err
	}
	if err := requireAll("", u.names, seen, u.observationSet); err != nil {
		return Frame{}, err
	}
	for i, j := range u.observation {
		if k := u.response[i]; j >= 0 && k >= 0 {
			copyMember(observationFrame.members[j].field(&v.o), responseFrame.members[k].field(&v.r))
		}
	}
	return Frame{Observation: &v.o}, nil
}

// copyMember copies a member's value between two fields of the same type.
func copyMember(dst, src any) {
	switch d := dst.(type) {
	case *string:
		*d = *src.(*string)
	default:
		panic("protocol: a member both frames declare has a type copyMember does not copy")
	}
}

// DecodeResponse decodes a frame that must be a response.
func DecodeResponse(frame []byte) (*Response, error) {
	f, err := DecodeFrame(frame)
	if err != nil {
		return nil, err
	}
	if f.Response == nil {
		return nil, errorf(ErrMalformed, "", "an observation where a response was expected")
	}
	return f.Response, nil
}

// decodeRequestPayload decodes a payload whose tag is not its first member
// (findTag, then a second pass).
func decodeRequestPayload(raw jsontext.Value) (RequestPayload, error) {
	const ptr = "/payload"
	tag, fast, err := findTag(raw, ptr, "operation")
	if err != nil {
		return nil, err
	}
	d := newDecoder(raw)
	_ = d.open(ptr) // findTag has checked it is an object
	var seen uint64
	if fast {
		// The tag came first: skip it and read the rest in the same pass.
		if _, err := d.d.ReadToken(); err != nil {
			return nil, d.wrap(err)
		}
		if _, err := d.d.ReadToken(); err != nil {
			return nil, d.wrap(err)
		}
		seen = 1
	}
	return readRequestPayload(d, ptr, tag, seen)
}

// readRequestPayload reads the members of a request payload tagged tag,
// from a decoder inside its object (seen has bit 0 set if the tag member
// was read already).
func readRequestPayload(d *decoder, ptr, tag string, seen uint64) (RequestPayload, error) {
	c, ok := requestCodecs[Operation(tag)]
	if !ok {
		return nil, errorf(ErrMalformed, ptr+"/operation", "unknown operation %q", tag)
	}
	v, err := c.read(d, ptr, tag, seen)
	if err != nil {
		return nil, err
	}
	return v.(RequestPayload), nil
}

// decodeResponsePayload decodes a payload whose tag is not its first
// member.
func decodeResponsePayload(raw jsontext.Value) (ResponsePayload, error) {
	const ptr = "/payload"
	tag, fast, err := findTag(raw, ptr, "result")
	if err != nil {
		return nil, err
	}
	d := newDecoder(raw)
	_ = d.open(ptr)
	var seen uint64
	if fast {
		if _, err := d.d.ReadToken(); err != nil {
			return nil, d.wrap(err)
		}
		if _, err := d.d.ReadToken(); err != nil {
			return nil, d.wrap(err)
		}
		seen = 1
	}
	return readResponsePayload(d, ptr, tag, seen)
}

// readResponsePayload is readRequestPayload for responses.
func readResponsePayload(d *decoder, ptr, tag string, seen uint64) (ResponsePayload, error) {
	c, ok := responseCodecs[Result(tag)]
	if !ok {
		return nil, errorf(ErrMalformed, ptr+"/result", "unknown result %q", tag)
	}
	v, err := c.read(d, ptr, tag, seen)
	if err != nil {
		return nil, err
	}
	return v.(ResponsePayload), nil
}

// payload reads a payload object in the frame's own pass when its tag is
// its first member (what every encoder here writes); otherwise it skips
// the object and decodes its bytes again with the tag found first.
func (d *decoder) payload(ptr, tagName string, inline func(d *decoder, tag string) error, slow func(raw jsontext.Value) error) error {
	if d.fast {
		if err := d.open(ptr); err != nil {
			return err
		}
		if d.next() != '"' {
			return errFast
		}
		name, end, ok := strictjson.StringAt(d.src, d.i)
		if !ok || string(name) != tagName {
			return errFast // the tag elsewhere: the full mode finds it
		}
		d.i = end
		if d.next() != ':' {
			return errFast
		}
		d.i++
		tag, err := d.fastString()
		if err != nil {
			return err
		}
		d.more = true
		return inline(d, tag)
	}
	if k := d.d.PeekKind(); k != '{' {
		return d.wrongKind(ptr, "a payload object", k)
	}
	if _, err := d.d.ReadToken(); err != nil {
		return d.wrap(err)
	}
	start := d.d.InputOffset() - 1
	if d.d.PeekKind() == '"' {
		name, err := d.d.ReadToken()
		if err != nil {
			return d.wrap(err)
		}
		if name.String() == tagName {
			tag, err := d.string(ptr + "/" + tagName)
			if err != nil {
				return err
			}
			return inline(d, tag)
		}
		if err := d.d.SkipValue(); err != nil {
			return d.wrap(err)
		}
	}
	for d.d.PeekKind() == '"' {
		if _, err := d.d.ReadToken(); err != nil {
			return d.wrap(err)
		}
		if err := d.d.SkipValue(); err != nil {
			return d.wrap(err)
		}
	}
	if _, err := d.d.ReadToken(); err != nil { // '}'
		return d.wrap(err)
	}
	end := d.d.InputOffset()
	return slow(jsontext.Value(d.src[start:end:end]))
}

// findTag returns the string value of the payload's tag member. fast is true
// when the tag is the object's first member (what every encoder here
// writes), so that the payload can be decoded in the same pass.
func findTag(raw jsontext.Value, ptr, tagName string) (tag string, fast bool, err error) {
	d := newDecoder(raw)
	if err := d.open(ptr); err != nil {
		return "", false, err
	}
	for first := true; ; first = false {
		switch d.d.PeekKind() {
		case '}':
			return "", false, errorf(ErrMalformed, ptr, "missing member %q", tagName)
		case 0:
			_, err := d.d.ReadToken()
			return "", false, d.wrap(err)
		}
		tok, err := d.d.ReadToken()
		if err != nil {
			return "", false, d.wrap(err)
		}
		if tok.String() == tagName {
			s, err := d.string(ptr + "/" + tagName)
			return s, first, err
		}
		if err := d.d.SkipValue(); err != nil {
			return "", false, d.wrap(err)
		}
	}
}

type decoder struct {
	d   *jsontext.Decoder
	src []byte
	buf bytes.Buffer

	// The fast mode: i is the offset in src; more is true once a member
	// has been read in the innermost open object (a ',' must come next).
	fast bool
	i    int
	more bool
}

// errFast is the fast mode giving up; the full mode then decides.
var errFast = errors.New("protocol: not on the fast path")

// rawDepth is the nesting the fast mode assumes around a raw value: the
// deepest place one sits (frame → payload → state → value). Assuming it
// everywhere is at least as strict as the full mode about MaxDepth.
const rawDepth = 3

// ws skips whitespace (fast mode).
func (d *decoder) ws() {
	for d.i < len(d.src) {
		switch d.src[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next skips whitespace and returns the next byte, or 0 at the end (fast
// mode).
func (d *decoder) next() byte {
	d.ws()
	if d.i >= len(d.src) {
		return 0
	}
	return d.src[d.i]
}

// fastString reads a string value (fast mode).
func (d *decoder) fastString() (string, error) {
	d.ws()
	content, end, ok := strictjson.StringAt(d.src, d.i)
	if !ok {
		return "", errFast
	}
	d.i = end
	return string(content), nil
}

var decodeOptions = []jsontext.Options{jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)}

func newDecoder(b []byte) *decoder {
	return &decoder{d: jsontext.NewDecoder(bytes.NewBuffer(b), decodeOptions...), src: b}
}

// decoders keeps the frame decoders of DecodeFrame and DecodeRequest (a
// jsontext.Decoder and its name sets are a few KiB: every frame of every
// call would allocate them).
var decoders = sync.Pool{New: func() any {
	return &decoder{d: jsontext.NewDecoder(bytes.NewBuffer(nil), decodeOptions...)}
}}

// pooledDecoder returns a decoder of b from the pool; put it back with
// release once nothing reads it. What it returns (strings, sub-slices of b)
// does not refer to it.
func pooledDecoder(b []byte) *decoder {
	d := decoders.Get().(*decoder)
	d.src = b
	d.buf = *bytes.NewBuffer(b)
	d.d.Reset(&d.buf, decodeOptions...)
	return d
}

func (d *decoder) release() {
	d.src = nil
	d.buf = bytes.Buffer{}
	decoders.Put(d)
}

func (d *decoder) wrap(err error) error {
	if err == nil {
		return nil
	}
	if d.fast {
		return errFast
	}
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		reason := "invalid JSON"
		if syn.Err != nil {
			reason = syn.Err.Error()
		}
		if errors.Is(err, jsontext.ErrDuplicateName) {
			reason = "duplicate member name"
		}
		return &Error{Kind: ErrMalformed, Pointer: string(syn.JSONPointer), Reason: reason}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &Error{Kind: ErrMalformed, Pointer: string(d.d.StackPointer()), Reason: "unexpected end of frame"}
	}
	return &Error{Kind: ErrMalformed, Pointer: string(d.d.StackPointer()), Reason: err.Error()}
}

func (d *decoder) open(ptr string) error {
	if d.fast {
		if d.next() != '{' {
			return errFast
		}
		d.i++
		d.more = false
		return nil
	}
	if d.d.PeekKind() != '{' {
		if d.d.PeekKind() == 0 {
			_, err := d.d.ReadToken()
			if err != nil {
				return d.wrap(err)
			}
		}
		return errorf(ErrMalformed, ptr, "expected a JSON object")
	}
	_, err := d.d.ReadToken()
	return d.wrap(err)
}

// end checks that nothing but whitespace follows the value.
func (d *decoder) end() error {
	if d.fast {
		d.ws()
		if d.i != len(d.src) {
			return errFast
		}
		return nil
	}
	if _, err := d.d.ReadToken(); err != io.EOF {
		if err == nil {
			return errorf(ErrMalformed, "", "trailing data after the frame")
		}
		return d.wrap(err)
	}
	return nil
}

// members reads the members of an object whose '{' has been consumed,
// calling read with each member's index in names. It rejects names not in
// names (duplicates are rejected by the decoder itself) and returns the set
// of indexes seen, starting from seen.
func (d *decoder) members(ptr string, names []string, seen uint64, read func(i int, ptr string) error) (uint64, error) {
	if d.fast {
		return d.fastMembers(ptr, names, seen, read)
	}
	for {
		switch d.d.PeekKind() {
		case '}':
			_, err := d.d.ReadToken()
			return seen, d.wrap(err)
		case 0:
			_, err := d.d.ReadToken()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return seen, d.wrap(err)
		}
		// The name is read raw and matched against the known names without
		// an allocation; only a name with an escape or an unknown name is
		// decoded into a string.
		raw, err := d.d.ReadValue()
		if err != nil {
			return seen, d.wrap(err)
		}
		i := indexOfQuoted(names, raw)
		if i < 0 {
			u, err := jsontext.AppendUnquote(nil, raw)
			if err != nil {
				return seen, d.wrap(err)
			}
			name := string(u)
			if i = indexOf(names, name); i < 0 {
				return seen, errorf(ErrMalformed, ptr+"/"+escapePointer(name), "unknown member %q", name)
			}
		}
		p := ptr + "/" + escapePointer(names[i])
		seen |= 1 << i
		if err := read(i, p); err != nil {
			return seen, d.wrap(err)
		}
	}
}

// fastMembers is members in the fast mode: a repeated name is one whose
// index was seen already (every name is known, or the walk gives up).
func (d *decoder) fastMembers(ptr string, names []string, seen uint64, read func(i int, ptr string) error) (uint64, error) {
	for {
		c := d.next()
		if c == '}' {
			d.i++
			d.more = true // the object is a value of its parent
			return seen, nil
		}
		if d.more {
			if c != ',' {
				return seen, errFast
			}
			d.i++
			c = d.next()
		}
		if c != '"' {
			return seen, errFast
		}
		name, end, ok := strictjson.StringAt(d.src, d.i)
		if !ok || end-d.i != len(name)+2 { // an escaped name: leave it to the full mode
			return seen, errFast
		}
		d.i = end
		i := indexOfQuoted(names, d.src[end-len(name)-2:end])
		if i < 0 || seen&(1<<i) != 0 || d.next() != ':' {
			return seen, errFast
		}
		d.i++
		seen |= 1 << i
		d.more = false
		if err := read(i, ptr); err != nil { // pointers only matter in errors: the full mode's
			return seen, errFast
		}
		d.more = true
	}
}

func requireAll(ptr string, names []string, seen, want uint64) error {
	for i, n := range names {
		if want&(1<<i) != 0 && seen&(1<<i) == 0 {
			return errorf(ErrMalformed, ptr, "missing member %q", n)
		}
	}
	return nil
}

func onlyMembers(ptr string, names []string, seen, allowed uint64, what string) error {
	for i, n := range names {
		if seen&(1<<i) != 0 && allowed&(1<<i) == 0 {
			return errorf(ErrMalformed, ptr+"/"+n, "member %q is not allowed in %s", n, what)
		}
	}
	return nil
}

// indexOfQuoted finds a name given as a JSON string without escapes.
func indexOfQuoted(names []string, quoted []byte) int {
	if len(quoted) < 2 {
		return -1
	}
	unquoted := quoted[1 : len(quoted)-1]
	for i, n := range names {
		if n == string(unquoted) {
			return i
		}
	}
	return -1
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}

func escapePointer(name string) string {
	if !strings.ContainsAny(name, "~/") {
		return name
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}

func (d *decoder) string(p string) (string, error) {
	if d.fast {
		return d.fastString()
	}
	if k := d.d.PeekKind(); k != '"' {
		return "", d.wrongKind(p, "a string", k)
	}
	tok, err := d.d.ReadToken()
	if err != nil {
		return "", d.wrap(err)
	}
	return tok.String(), nil
}

func (d *decoder) bool(p string) (bool, error) {
	if d.fast {
		d.ws()
		switch rest := d.src[d.i:]; {
		case bytes.HasPrefix(rest, []byte("true")):
			d.i += 4
			return true, nil
		case bytes.HasPrefix(rest, []byte("false")):
			d.i += 5
			return false, nil
		}
		return false, errFast
	}
	if k := d.d.PeekKind(); k != 't' && k != 'f' {
		return false, d.wrongKind(p, "a boolean", k)
	}
	tok, err := d.d.ReadToken()
	if err != nil {
		return false, d.wrap(err)
	}
	return tok.Bool(), nil
}

// uint reads a non-negative integer that fits in 64 bits, written without
// fraction or exponent.
func (d *decoder) uint(p string) (uint64, error) {
	if d.fast {
		d.ws()
		end, ok := strictjson.NumberAt(d.src, d.i)
		if !ok {
			return 0, errFast
		}
		lit := d.src[d.i:end]
		if bytes.ContainsAny(lit, "-.eE") {
			return 0, errFast
		}
		n, err := strconv.ParseUint(string(lit), 10, 64)
		if err != nil {
			return 0, errFast
		}
		d.i = end
		return n, nil
	}
	if k := d.d.PeekKind(); k != '0' {
		return 0, d.wrongKind(p, "an unsigned integer", k)
	}
	tok, err := d.d.ReadToken()
	if err != nil {
		return 0, d.wrap(err)
	}
	lit := tok.String()
	if strings.ContainsAny(lit, "-.eE") {
		return 0, errorf(ErrMalformed, p, "%s is not an unsigned integer", lit)
	}
	n, err := strconv.ParseUint(lit, 10, 64)
	if err != nil {
		return 0, errorf(ErrMalformed, p, "%s does not fit in 64 bits", lit)
	}
	return n, nil
}

// contract reads a contract object into c.
func (d *decoder) contract(p string, c *ContractRef) error {
	if d.fast {
		if err := d.open(p); err != nil {
			return err
		}
	} else if k := d.d.PeekKind(); k != '{' {
		return d.wrongKind(p, "a contract object", k)
	} else if err := d.open(p); err != nil {
		return err
	}
	return contractCodec.readInto(d, p, "", 0, c)
}

func (d *decoder) strings(p string) ([]string, error) {
	if d.fast {
		if d.next() != '[' {
			return nil, errFast
		}
		d.i++
		out := []string{}
		if d.next() == ']' {
			d.i++
			return out, nil
		}
		for {
			if len(out) >= MaxAdmittedCapabilities*4 {
				return nil, errFast
			}
			s, err := d.fastString()
			if err != nil {
				return nil, err
			}
			out = append(out, s)
			switch d.next() {
			case ',':
				d.i++
			case ']':
				d.i++
				return out, nil
			default:
				return nil, errFast
			}
		}
	}
	if k := d.d.PeekKind(); k != '[' {
		return nil, d.wrongKind(p, "an array of strings", k)
	}
	if _, err := d.d.ReadToken(); err != nil {
		return nil, d.wrap(err)
	}
	out := []string{}
	for i := 0; ; i++ {
		switch d.d.PeekKind() {
		case ']':
			_, err := d.d.ReadToken()
			return out, d.wrap(err)
		case 0:
			_, err := d.d.ReadToken()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return nil, d.wrap(err)
		}
		if i >= MaxAdmittedCapabilities*4 {
			return nil, errorf(ErrTooLarge, p, "more than %d items", MaxAdmittedCapabilities*4)
		}
		s, err := d.string(p + "/" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
}

// raw reads any JSON value and returns it as a sub-slice of the input.
func (d *decoder) raw(p string) (jsontext.Value, error) {
	if d.fast {
		d.ws()
		start := d.i
		end, ok := strictjson.ValueAt(d.src, start, rawDepth)
		if !ok {
			return nil, errFast
		}
		d.i = end
		return jsontext.Value(d.src[start:end:end]), nil
	}
	v, err := d.d.ReadValue()
	if err != nil {
		return nil, d.wrap(err)
	}
	end := d.d.InputOffset()
	return jsontext.Value(d.src[end-int64(len(v)) : end : end]), nil
}

func (d *decoder) state(p string) (State, error) {
	if d.fast {
		if err := d.open(p); err != nil {
			return State{}, err
		}
	} else if k := d.d.PeekKind(); k != '{' {
		return State{}, d.wrongKind(p, "a state object", k)
	} else if err := d.open(p); err != nil {
		return State{}, err
	}
	v, err := stateCodec.read(d, p, "", 0)
	if err != nil {
		return State{}, err
	}
	return *v.(*State), nil
}

func (d *decoder) wrongKind(p, want string, got jsontext.Kind) error {
	if got == 0 {
		_, err := d.d.ReadToken()
		if err != nil {
			return d.wrap(err)
		}
	}
	return errorf(ErrMalformed, p, "expected %s, found %s", want, kindName(got))
}

func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "nothing"
}
