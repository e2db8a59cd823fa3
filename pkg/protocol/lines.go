package protocol

import (
	"bufio"
	"errors"
	"io"
)

// LineReader reads NDJSON frames with an explicit cap, never the default
// bufio.Scanner (which stops at 64 KiB and leaves the writer to die of
// EPIPE). Each frame is returned in a fresh slice the caller owns.
type LineReader struct {
	r   *bufio.Reader
	max int
	err error
	// scratch gathers a frame longer than the buffer; it is kept for the
	// next one (it never grows past the cap).
	scratch []byte
}

// NewLineReader reads frames of at most max bytes (the newline not counted)
// from r.
func NewLineReader(r io.Reader, max int) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Next returns the next frame without its newline. It returns io.EOF at a
// clean end of stream, an *Error of kind ErrTooLarge as soon as a frame
// passes the cap (without buffering more than the cap), and an *Error of kind
// ErrMalformed for a last frame with no newline. After any error the reader
// is spent and returns the same error again.
func (lr *LineReader) Next() ([]byte, error) {
	if lr.err != nil {
		return nil, lr.err
	}
	var line []byte
	for {
		chunk, err := lr.r.ReadSlice('\n')
		n := len(line) + len(chunk)
		if err == nil {
			n-- // the newline is not part of the frame
		}
		if n > lr.max {
			lr.err = errorf(ErrTooLarge, "", "frame exceeds %d bytes", lr.max)
			return nil, lr.err
		}
		switch {
		case err == nil:
			if line == nil {
				return append([]byte(nil), chunk[:len(chunk)-1]...), nil
			}
			line = append(line, chunk[:len(chunk)-1]...)
			frame := append(make([]byte, 0, len(line)), line...)
			lr.scratch = line[:0] // at most the cap: kept for the next large frame
			return frame, nil
		case errors.Is(err, bufio.ErrBufferFull):
			if line == nil {
				line = lr.scratch[:0]
			}
			line = append(line, chunk...)
		case errors.Is(err, io.EOF):
			if len(line)+len(chunk) == 0 {
				lr.err = io.EOF
			} else {
				lr.err = errorf(ErrMalformed, "", "stream ended inside a frame (%d bytes without a newline)", len(line)+len(chunk))
			}
			return nil, lr.err
		default:
			lr.err = err
			return nil, err
		}
	}
}
