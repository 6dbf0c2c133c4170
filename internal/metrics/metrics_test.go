package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Series of subscriptions and topics that are gone are dropped, on the
// second Retain that does not keep them: one created while its caller
// listed may be missing from the first.
func TestRetain(t *testing.T) {
	r := New()
	r.Subscription("projects/p/subscriptions/kept").Acked.Inc()
	r.Subscription("projects/p/subscriptions/gone").Acked.Inc()
	r.PushFailed("projects/p/subscriptions/gone")
	r.Topic("projects/p/topics/kept").Published.Inc()
	r.Topic("projects/p/topics/gone").Published.Inc()
	keep := func(name string) bool {
		return name == "projects/p/subscriptions/kept" || name == "projects/p/topics/kept"
	}
	count := func() (subs, topics, pushes int) {
		return testutil.CollectAndCount(r.acked), testutil.CollectAndCount(r.published), testutil.CollectAndCount(r.pushFailures)
	}

	r.Retain(keep, keep)
	if s, tp, p := count(); s != 2 || tp != 2 || p != 1 {
		t.Fatalf("after one Retain: %d subscription, %d topic, %d push series; want 2, 2, 1", s, tp, p)
	}
	r.Retain(keep, keep)
	if s, tp, p := count(); s != 1 || tp != 1 || p != 0 {
		t.Fatalf("after two: %d subscription, %d topic, %d push series; want 1, 1, 0", s, tp, p)
	}
	if v := testutil.ToFloat64(r.Subscription("projects/p/subscriptions/kept").Acked); v != 1 {
		t.Errorf("the kept subscription's count is %v, want 1", v)
	}
	// One that comes back starts again from 0.
	if v := testutil.ToFloat64(r.Subscription("projects/p/subscriptions/gone").Acked); v != 0 {
		t.Errorf("a subscription created again counts %v, want 0", v)
	}
}
