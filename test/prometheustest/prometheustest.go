// Package prometheustest runs a real Prometheus (bin/prometheus, built from
// the Go module proxy by `make prometheus`) on loopback for tests: a
// configuration of static scrape targets, each with labels of its own (the
// node it stands for), a scrape interval of a second, TSDB storage in a
// temporary directory, and its output kept in a log file. Test packages
// only.
package prometheustest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"iteron.dev/operator/test/childproc"
	"iteron.dev/operator/test/registrytest"
)

// Target is one endpoint scraped at /metrics.
type Target struct {
	// Address is host:port (loopback).
	Address string
	// Labels are attached to every series scraped from it (node=…).
	Labels map[string]string
}

// Options configure a Prometheus.
type Options struct {
	// Dir holds its configuration, storage and log.
	Dir string
	// Binary is the prometheus binary (default: <repo>/bin/prometheus).
	Binary string
	// Targets are scraped every ScrapeInterval (default 1s) as job
	// "iteron-manager".
	Targets        []Target
	ScrapeInterval time.Duration
}

// Prometheus is a running Prometheus.
type Prometheus struct {
	// URL is its base URL on 127.0.0.1.
	URL string
	// LogFile is where its output goes.
	LogFile string
	cmd     *exec.Cmd
	done    chan error
}

// Start writes the configuration and starts Prometheus, waiting until it
// is ready (/-/ready).
func Start(ctx context.Context, o Options) (*Prometheus, error) {
	if o.Binary == "" {
		root, err := registrytest.RepoRoot()
		if err != nil {
			return nil, err
		}
		o.Binary = filepath.Join(root, "bin", "prometheus")
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("prometheustest: %s: %w (run `make prometheus`)", o.Binary, err)
	}
	if o.ScrapeInterval == 0 {
		o.ScrapeInterval = time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\nscrape_configs:\n- job_name: iteron-manager\n  static_configs:\n", o.ScrapeInterval, o.ScrapeInterval)
	for _, t := range o.Targets {
		fmt.Fprintf(&cfg, "  - targets: [%q]\n", t.Address)
		if len(t.Labels) > 0 {
			keys := make([]string, 0, len(t.Labels))
			for k := range t.Labels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			cfg.WriteString("    labels:\n")
			for _, k := range keys {
				fmt.Fprintf(&cfg, "      %s: %q\n", k, t.Labels[k])
			}
		}
	}
	config := filepath.Join(o.Dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o644); err != nil {
		return nil, err
	}
	p := &Prometheus{URL: "http://" + addr, LogFile: filepath.Join(o.Dir, "prometheus.log"), done: make(chan error, 1)}
	logf, err := os.Create(p.LogFile)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(o.Binary, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(o.Dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := childproc.Start(p.cmd, syscall.SIGKILL); err != nil {
		logf.Close()
		return nil, fmt.Errorf("prometheustest: start: %w", err)
	}
	go func() { p.done <- p.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case err := <-p.done:
			log, _ := os.ReadFile(p.LogFile)
			return nil, fmt.Errorf("prometheustest: prometheus exited (%v): %s", err, log)
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, errors.New("prometheustest: not ready within 60s")
		}
	}
}

// Stop stops Prometheus (SIGTERM, then SIGKILL after 10 s) and waits.
func (p *Prometheus) Stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// Query runs an instant query and returns the raw answer's data.result.
func (p *Prometheus) Query(ctx context.Context, query string) (json.RawMessage, error) {
	resp, err := http.PostForm(p.URL+"/api/v1/query", url.Values{"query": {query}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", query, r.Error)
	}
	return r.Data.Result, nil
}

// TargetsUp reports how many targets the last scrape reached.
func (p *Prometheus) TargetsUp(ctx context.Context) (int, error) {
	res, err := p.Query(ctx, "sum(up)")
	if err != nil {
		return 0, err
	}
	var v []struct {
		Value [2]any `json:"value"`
	}
	if err := json.Unmarshal(res, &v); err != nil || len(v) == 0 {
		return 0, err
	}
	var n int
	_, err = fmt.Sscan(fmt.Sprint(v[0].Value[1]), &n)
	return n, err
}
