package analysis

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Sample is one element of an instant query's answer.
type Sample struct {
	// Labels are the series' labels (none for a scalar).
	Labels map[string]string
	// Value is the sample's value (NaN and ±Inf as Prometheus sends them).
	Value float64
}

// queryResponse is the JSON of /api/v1/query.
type queryResponse struct {
	Status    string          `json:"status"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Data      json.RawMessage `json:"data"`
}

type queryData struct {
	ResultType string          `json:"resultType"`
	Result     json.RawMessage `json:"result"`
}

type vectorSample struct {
	Metric map[string]string `json:"metric"`
	Value  []json.RawMessage `json:"value"`
}

// ParseQueryResponse reads the answer of a Prometheus instant query: a
// vector (its samples, sorted by labels) or a scalar (one sample without
// labels). An error answer, a matrix or a string, or a body that is not
// such a document, is an error naming what was wrong.
func ParseQueryResponse(body []byte) ([]Sample, error) {
	var r queryResponse
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("the answer is not a Prometheus API document: %v", err)
	}
	if r.Status != "success" {
		if r.Status == "error" {
			return nil, fmt.Errorf("the query failed: %s: %s", orDash(r.ErrorType), orDash(r.Error))
		}
		return nil, fmt.Errorf("the answer's status is %q, not success", r.Status)
	}
	var d queryData
	if err := json.Unmarshal(r.Data, &d); err != nil {
		return nil, fmt.Errorf("the answer's data is not a query result: %v", err)
	}
	switch d.ResultType {
	case "vector":
		var vs []vectorSample
		if err := json.Unmarshal(d.Result, &vs); err != nil {
			return nil, fmt.Errorf("the vector is malformed: %v", err)
		}
		out := make([]Sample, 0, len(vs))
		for i, s := range vs {
			v, err := sampleValue(s.Value)
			if err != nil {
				return nil, fmt.Errorf("sample %d: %v", i, err)
			}
			labels := s.Metric
			if labels == nil {
				labels = map[string]string{}
			}
			out = append(out, Sample{Labels: labels, Value: v})
		}
		sort.SliceStable(out, func(i, j int) bool { return labelKey(out[i].Labels) < labelKey(out[j].Labels) })
		return out, nil
	case "scalar":
		var pair []json.RawMessage
		if err := json.Unmarshal(d.Result, &pair); err != nil {
			return nil, fmt.Errorf("the scalar is malformed: %v", err)
		}
		v, err := sampleValue(pair)
		if err != nil {
			return nil, fmt.Errorf("the scalar: %v", err)
		}
		return []Sample{{Labels: map[string]string{}, Value: v}}, nil
	case "matrix":
		return nil, errors.New("the query returned a range vector (matrix); an analysis needs an instant vector or a scalar (wrap it in a function such as rate or avg_over_time)")
	case "":
		return nil, errors.New("the answer has no resultType")
	}
	return nil, fmt.Errorf("the query returned a %s; an analysis needs an instant vector or a scalar", d.ResultType)
}

// sampleValue reads [<unix time>, "<value>"].
func sampleValue(pair []json.RawMessage) (float64, error) {
	if len(pair) != 2 {
		return 0, fmt.Errorf("a sample is [time, value], not %d items", len(pair))
	}
	var ts float64
	if err := json.Unmarshal(pair[0], &ts); err != nil {
		return 0, fmt.Errorf("the sample time is not a number: %v", err)
	}
	var s string
	if err := json.Unmarshal(pair[1], &s); err != nil {
		return 0, fmt.Errorf("the sample value is not a string: %v", err)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("the sample value %q is not a number", truncate(s, 32))
	}
	return v, nil
}

func labelKey(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}

// SampleVars are a Prometheus condition's variables for samples.
func SampleVars(samples []Sample) map[string]any {
	result := make([]float64, len(samples))
	series := make([]map[string]any, len(samples))
	for i, s := range samples {
		result[i] = s.Value
		series[i] = map[string]any{"labels": s.Labels, "value": s.Value}
	}
	return map[string]any{"result": result, "series": series}
}

// FormatSamples is samples' values as a measurement records them: "[0.02,
// 0.31]" (NaN and ±Inf as Prometheus writes them), at most max bytes.
func FormatSamples(samples []Sample, max int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range samples {
		item := formatFloat(s.Value)
		if i > 0 {
			item = ", " + item
		}
		if b.Len()+len(item)+1 > max-24 && i < len(samples) {
			fmt.Fprintf(&b, " … %d more", len(samples)-i)
			break
		}
		b.WriteString(item)
	}
	b.WriteByte(']')
	return truncate(b.String(), max)
}

func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// truncate cuts s to at most n bytes at a UTF-8 boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}
