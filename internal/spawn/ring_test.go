package spawn

import (
	"strings"
	"testing"
)

func TestTheStderrRingKeepsTheNewestBytesAndCountsTheRest(t *testing.T) {
	cases := []struct {
		name    string
		size    int64
		writes  []string
		tail    string
		dropped int64
	}{
		{"a ring of zero keeps nothing", 0, []string{"abc"}, "", 3},
		{"writes that fit are kept whole", 8, []string{"ab", "cd"}, "abcd", 0},
		{"exactly the size is kept whole", 4, []string{"ab", "cd"}, "abcd", 0},
		{"one byte more drops the oldest", 4, []string{"ab", "cde"}, "bcde", 1},
		{"a write larger than the ring keeps its end", 4, []string{"x", "abcdefgh"}, "efgh", 5},
		{"many small writes wrap around", 3, strings.Split("abcdefghij", ""), "hij", 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRing(tc.size)
			var total int64
			for _, w := range tc.writes {
				n, err := r.Write([]byte(w))
				if err != nil || n != len(w) {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
				total += int64(n)
			}
			if got := string(r.Tail()); got != tc.tail || r.Dropped() != tc.dropped || r.Total() != total {
				t.Fatalf("tail %q dropped %d total %d; want %q, %d, %d", got, r.Dropped(), r.Total(), tc.tail, tc.dropped, total)
			}
		})
	}
}
