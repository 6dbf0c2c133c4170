package testutil

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is a scrape of a /metrics endpoint, parsed by Prometheus' own
// text parser: metric families by name.
type Metrics map[string]*dto.MetricFamily

// ScrapeErr GETs url, a /metrics endpoint, in the Prometheus text format
// and parses it.
func ScrapeErr(url string) (Metrics, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		return nil, fmt.Errorf("GET %s: Content-Type %q, want the text format 0.0.4", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Scrape is ScrapeErr failing the test on an error. Call it on the test
// goroutine.
func Scrape(t testing.TB, url string) Metrics {
	t.Helper()
	m, err := ScrapeErr(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return m
}

// Series returns the series of metric name whose labels include the given
// name/value pairs.
func (m Metrics) Series(name string, labels ...string) []*dto.Metric {
	f := m[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, s := range f.GetMetric() {
		if hasLabels(s, labels) {
			out = append(out, s)
		}
	}
	return out
}

func hasLabels(s *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Value is the value of the one series of name with the given labels: a
// counter's or gauge's value, a histogram's sample count. ok is false when
// there is no such series.
func (m Metrics) Value(name string, labels ...string) (v float64, ok bool) {
	for _, s := range m.Series(name, labels...) {
		return value(s), true
	}
	return 0, false
}

// Sum adds up every series of name with the given labels.
func (m Metrics) Sum(name string, labels ...string) float64 {
	var sum float64
	for _, s := range m.Series(name, labels...) {
		sum += value(s)
	}
	return sum
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Histogram != nil:
		return float64(s.GetHistogram().GetSampleCount())
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	return 0
}
