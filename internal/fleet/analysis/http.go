package analysis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Endpoint is where a request goes and its bounds.
type Endpoint struct {
	// URL is the full URL of the request.
	URL string
	// Timeout bounds the whole request, connecting included.
	Timeout time.Duration
	// MaxBytes bounds the response body.
	MaxBytes int64
}

// Answer is an HTTP answer within the bounds.
type Answer struct {
	Status int
	Body   []byte
}

// ErrTooLarge is wrapped by an answer whose body exceeds MaxBytes.
var ErrTooLarge = errors.New("the answer is too large")

// NewClient is the HTTP client of measurements: it never follows a
// redirect (a provider is reached where an administrator pointed it, not
// wherever it points next) and keeps a few idle connections per provider.
func NewClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 4
	return &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Post sends body (of contentType) to ep and reads the answer within ep's
// bounds. Its errors say which bound was hit: "no answer within 2s", "the
// answer is larger than 1024 bytes".
func Post(ctx context.Context, c *http.Client, ep Endpoint, contentType string, body []byte) (Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return Answer{}, fmt.Errorf("build the request to %s: %w", redact(ep.URL), err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "iteron-fleet-analysis")
	resp, err := c.Do(req)
	if err != nil {
		return Answer{}, describe(ctx, ep, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, ep.MaxBytes+1))
	if err != nil {
		return Answer{Status: resp.StatusCode}, describe(ctx, ep, err)
	}
	if int64(len(data)) > ep.MaxBytes {
		return Answer{Status: resp.StatusCode}, fmt.Errorf("%w: %s answered more than maxResponseBytes (%d bytes)", ErrTooLarge, redact(ep.URL), ep.MaxBytes)
	}
	return Answer{Status: resp.StatusCode, Body: data}, nil
}

// describe names a transport error by the bound or the failure.
func describe(ctx context.Context, ep Endpoint, err error) error {
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: no answer within %s (timeoutSeconds)", redact(ep.URL), ep.Timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%s: %v", redact(ep.URL), err)
}

// redact drops a URL's user information and query (they may hold a
// credential) from messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the provider"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return strings.TrimSuffix(u.String(), "?")
}
