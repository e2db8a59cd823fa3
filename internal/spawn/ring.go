package spawn

import "sync"

// Ring keeps the newest bytes written to it, up to its size, and counts the
// ones it dropped: a provider's stderr is evidence for status and doctor,
// bounded, and never a fault.
type Ring struct {
	mu      sync.Mutex
	buf     []byte
	size    int
	start   int // index of the oldest byte when full
	full    bool
	dropped int64
	total   int64
}

// NewRing returns a ring keeping at most size bytes.
func NewRing(size int64) *Ring {
	if size < 0 {
		size = 0
	}
	return &Ring{buf: make([]byte, 0, size), size: int(size)}
}

// Write keeps the newest bytes of p and counts the ones pushed out.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	r.total += int64(n)
	if r.size == 0 {
		r.dropped += int64(n)
		return n, nil
	}
	if len(p) > r.size {
		// Only the last size bytes of p can survive.
		r.dropped += int64(len(p) - r.size)
		p = p[len(p)-r.size:]
	}
	for len(p) > 0 {
		if !r.full {
			room := r.size - len(r.buf)
			k := min(room, len(p))
			r.buf = append(r.buf, p[:k]...)
			p = p[k:]
			if len(r.buf) == r.size {
				r.full = true
				r.start = 0
			}
			continue
		}
		k := min(r.size-r.start, len(p))
		copy(r.buf[r.start:], p[:k])
		r.dropped += int64(k)
		r.start = (r.start + k) % r.size
		p = p[k:]
	}
	return n, nil
}

// Tail returns a copy of the kept bytes, oldest first.
func (r *Ring) Tail() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]byte(nil), r.buf...)
	}
	out := make([]byte, 0, r.size)
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}

// Dropped is the number of bytes written but no longer kept.
func (r *Ring) Dropped() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Total is the number of bytes written.
func (r *Ring) Total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}
