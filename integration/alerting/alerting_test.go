// Package alerting runs the alerting rules of deploy/prometheus in a real
// Prometheus scraping a real sidecar.
package alerting

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// rulesFile is the rules operators load.
var rulesFile = filepath.Join("..", "..", "deploy", "prometheus", "jetorder-rules.yml")

// A message a handler holds without acking raises JetOrderKeyStuck in
// Prometheus once the oldest unacked age has been past the bound for the
// rule's for, and the ack clears it. The rule's bound and for are
// shortened to seconds; its expression, and the recording rule it reads,
// are the file's.
func TestKeyStuckAlert(t *testing.T) {
	itest.PrometheusTool(t, "prometheus") // skip before building, if it is missing
	s := itest.Start(t, sidecar.Config{}, itest.Binary(itest.BuildSidecar(t)))
	rules := shortened(t, "JetOrderKeyStuck", map[string]string{
		"subscription:jetorder_oldest_unacked_age_seconds:max > 300": "subscription:jetorder_oldest_unacked_age_seconds:max > 5",
		"for: 2m": "for: 3s",
	})
	prom := itest.StartPrometheus(t, itest.PrometheusConfig{Targets: []string{s.HTTP}, RuleFiles: []string{rules}})

	c := s.GoClient()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: itest.TopicPath("alerting")}); err != nil {
		t.Fatal(err)
	}
	sub := itest.SubPath("alerting-sub")
	itest.MustCreateSub(t, c, &pb.Subscription{Name: sub, Topic: itest.TopicPath("alerting"), EnableMessageOrdering: true, AckDeadlineSeconds: 10})
	p := c.Publisher("alerting")
	p.EnableMessageOrdering = true
	t.Cleanup(p.Stop)
	published := time.Now()
	for i := range 3 {
		if _, err := p.Publish(context.Background(), &pubsub.Message{Data: fmt.Appendf(nil, "m%d", i), OrderingKey: "k"}).Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	// The handler holds the first message (the client extends its
	// deadline) until release; later ones it acks at once.
	held, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // before ReceiveGo's cleanup waits for the handlers
	var holdOnce sync.Once
	itest.ReceiveGo(t, c.Subscriber("alerting-sub"), func(ctx context.Context, m *pubsub.Message) {
		holdOnce.Do(func() {
			close(held)
			select {
			case <-release:
			case <-ctx.Done():
				m.Nack()
				return
			}
		})
		m.Ack()
	})
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first message was not delivered within 30s")
	}

	alerts := prom.WaitAlerts(60*time.Second, "JetOrderKeyStuck firing for "+sub, func(alerts []itest.PrometheusAlert) bool {
		return find(alerts, "JetOrderKeyStuck", sub, "firing") != nil
	})
	a := find(alerts, "JetOrderKeyStuck", sub, "firing")
	t.Logf("JetOrderKeyStuck firing %v after the publish", time.Since(published).Round(time.Millisecond))
	if a.Labels["severity"] != "critical" || a.Labels["job"] != "jetorder" {
		t.Errorf("JetOrderKeyStuck labels %v, want severity critical and job jetorder", a.Labels)
	}
	if !strings.HasPrefix(a.Annotations["summary"], sub+": a message unacked for ") || !strings.HasSuffix(a.Annotations["runbook_url"], "docs/OPERATING.md#jetorderkeystuck") {
		t.Errorf("JetOrderKeyStuck annotations %v", a.Annotations)
	}
	for _, other := range alerts {
		if other.State == "firing" && other.Labels["alertname"] != "JetOrderKeyStuck" {
			t.Errorf("%s fires for a healthy sidecar: %+v", other.Labels["alertname"], other)
		}
	}

	releaseOnce()
	acked := time.Now()
	prom.WaitAlerts(60*time.Second, "JetOrderKeyStuck gone once the message is acked", func(alerts []itest.PrometheusAlert) bool {
		return find(alerts, "JetOrderKeyStuck", sub, "") == nil
	})
	t.Logf("JetOrderKeyStuck gone %v after the ack", time.Since(acked).Round(time.Millisecond))
}

// find is the alert named name of subscription sub in state ("" any), or
// nil.
func find(alerts []itest.PrometheusAlert, name, sub, state string) *itest.PrometheusAlert {
	for i, a := range alerts {
		if a.Labels["alertname"] == name && a.Labels["subscription"] == sub && (state == "" || a.State == state) {
			return &alerts[i]
		}
	}
	return nil
}

// shortened writes a copy of rulesFile in which the rule of alert has each
// old string of replace replaced by the new one, each found exactly once
// in that rule, and returns its path.
func shortened(t *testing.T, alert string, replace map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "- alert: "+alert+"\n")
	if start < 0 {
		t.Fatalf("%s has no alert %s", rulesFile, alert)
	}
	end := len(text)
	if next := strings.Index(text[start+1:], "- alert: "); next >= 0 {
		end = start + 1 + next
	}
	rule := text[start:end]
	for old, repl := range replace {
		if n := strings.Count(rule, old); n != 1 {
			t.Fatalf("the rule %s of %s has %q %d times, want once:\n%s", alert, rulesFile, old, n, rule)
		}
		rule = strings.Replace(rule, old, repl, 1)
	}
	out := filepath.Join(t.TempDir(), "jetorder-rules.yml")
	if err := os.WriteFile(out, []byte(text[:start]+rule+text[end:]), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
