package itest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/internal/testutil"
)

// Prometheus, the server and its promtool, from the Debian package
// prometheus (make prometheus, .ci/prometheus): for the tests of the
// alerting and recording rules of deploy/prometheus.

// PrometheusTool is the path of name, "prometheus" or "promtool", on PATH.
// Without it the test is skipped, unless JETORDER_REQUIRE_PROMETHEUS=1
// (CI), where it fails.
func PrometheusTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s is not installed (apt-get install prometheus, or make prometheus as root)", name)
	if os.Getenv("JETORDER_REQUIRE_PROMETHEUS") == "1" {
		t.Fatalf("%s (JETORDER_REQUIRE_PROMETHEUS=1)", msg)
	}
	t.Skip(msg)
	return ""
}

// PrometheusConfig is what StartPrometheus runs.
type PrometheusConfig struct {
	// Targets are the host:port of the sidecars' HTTP APIs, scraped at
	// /metrics as the job "jetorder", the job the rules expect.
	Targets []string
	// RuleFiles are loaded through rule_files.
	RuleFiles []string
	// Interval is both the scrape and the rule evaluation interval;
	// default 1s.
	Interval time.Duration
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	// URL is where its HTTP API listens: http://127.0.0.1:port.
	URL string

	t    testing.TB
	proc *Process
}

// StartPrometheus starts a Prometheus server configured by cfg, on a free
// loopback port, with its storage in a temp dir, and waits until it is
// ready. It is killed when the test ends; a test that failed logs its
// output. Without the prometheus program the test is skipped or fails, as
// PrometheusTool says.
func StartPrometheus(t testing.TB, cfg PrometheusConfig) *Prometheus {
	t.Helper()
	bin := PrometheusTool(t, "prometheus")
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	dir := t.TempDir()
	quote := func(s []string) string {
		b, _ := json.Marshal(s) // YAML takes JSON's lists of strings
		return string(b)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: %[2]s
scrape_configs:
  - job_name: jetorder
    static_configs:
      - targets: %[3]s
`, cfg.Interval, quote(cfg.RuleFiles), quote(cfg.Targets))
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	p := &Prometheus{URL: "http://" + addr, t: t}
	p.proc = StartProcess(t, bin, []string{
		"--config.file=" + file,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
	}, nil, nil)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus, configured by\n%s\nwrote:\n%s", config, p.proc.Log())
		}
	})
	ready := func() bool {
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		select {
		case <-p.proc.Exited():
			t.Fatalf("prometheus exited with %d at start:\n%s", p.proc.ExitCode(), p.proc.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 30s:\n%s", p.proc.Log())
		}
	}
	return p
}

// PrometheusAlert is an alert as Prometheus' /api/v1/alerts lists it.
type PrometheusAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // "pending" or "firing"
	Value       string            `json:"value"`
}

// Alerts are the alerts pending or firing now.
func (p *Prometheus) Alerts() ([]PrometheusAlert, error) {
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []PrometheusAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/alerts", &body); err != nil {
		return nil, err
	}
	return body.Data.Alerts, nil
}

// Targets describes the scrape targets' health, for failure messages.
func (p *Prometheus) Targets() string {
	var body struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string `json:"scrapeUrl"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/targets", &body); err != nil {
		return err.Error()
	}
	var out []string
	for _, tg := range body.Data.ActiveTargets {
		out = append(out, fmt.Sprintf("%s %s %s", tg.ScrapeURL, tg.Health, tg.LastError))
	}
	return strings.Join(out, "; ")
}

func (p *Prometheus) get(path string, v any) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(p.URL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// WaitAlerts polls the alerts until cond holds of them, failing the test
// after timeout with the last alerts and the targets' health.
func (p *Prometheus) WaitAlerts(timeout time.Duration, what string, cond func([]PrometheusAlert) bool) []PrometheusAlert {
	p.t.Helper()
	var alerts []PrometheusAlert
	var err error
	testutil.Eventually(p.t, timeout, func() bool {
		alerts, err = p.Alerts()
		return err == nil && cond(alerts)
	}, "%s; last alerts: %v (err %v); targets: %s", what, func() string { return fmt.Sprintf("%+v", alerts) }, func() error { return err }, p.Targets)
	return alerts
}
