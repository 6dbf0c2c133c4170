package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// ownedPartitions counts the partitions of sub that sidecar sc says it
// owns, from its /v1/status.
func ownedPartitions(t *testing.T, sc *itest.Sidecar, sub string) (owned, total int) {
	owned, total, _ = partitionHolders(t, sc, sub)
	return owned, total
}

// partitionHolders is ownedPartitions, with the number of partitions each
// sidecar holds by the name sc's status page gives it.
func partitionHolders(t *testing.T, sc *itest.Sidecar, sub string) (owned, total int, holders map[string]int) {
	t.Helper()
	resp, err := sc.HTTPClient().Get(sc.HTTPURL() + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Subscriptions []struct {
			Name       string `json:"name"`
			Partitions []struct {
				Owner  string `json:"owner"`
				Holder string `json:"holder"`
			} `json:"partitions"`
		} `json:"subscriptions"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	holders = map[string]int{}
	for _, s := range st.Subscriptions {
		if s.Name != subPath(sub) {
			continue
		}
		for _, p := range s.Partitions {
			total++
			if p.Owner == "this sidecar" {
				owned++
			}
			if p.Holder != "" {
				holders[p.Holder]++
			}
		}
	}
	return owned, total, holders
}

// Three sidecars on one JetStream receiving one ordered subscription
// through Google's Go client share its work: in partitioned delivery each
// owns its share of the partitions, rounded up at most; in per-key
// delivery each receives a third of the messages or so. A sidecar that
// leaves, and one that joins, have the partitions rebalanced within 5 s,
// and every delivery keeps order throughout (the checker sees them all).
func TestScaleOutSharesOneSubscription(t *testing.T) {
	first := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0", Name: "sidecar-0"})
	scs := []*itest.Sidecar{first,
		itest.Start(t, sidecar.Config{NATSURL: first.NATS, Name: "sidecar-1"}),
		itest.Start(t, sidecar.Config{NATSURL: first.NATS, Name: "sidecar-2"})}
	admin := first.GoClient()
	mustCreateTopic(t, admin, "spread")
	mustCreateSub(t, admin, &pb.Subscription{Name: subPath("spread-sub"), Topic: topicPath("spread"), EnableMessageOrdering: true, AckDeadlineSeconds: 10})
	chk := ordercheck.New()
	got := make([]atomic.Int64, 4)
	receive := func(i int, sc *itest.Sidecar) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		handle := itest.CheckedHandler(chk, "spread-sub", 0)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = sc.GoClient().Subscriber("spread-sub").Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
				got[i].Add(1)
				handle(ctx, m)
			})
		}()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	stops := make([]context.CancelFunc, 3)
	for i, sc := range scs {
		stops[i] = receive(i, sc)
	}
	pub := admin.Publisher("spread")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	keys := make([]string, 240)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	itest.PublishChecked(t, pub, chk, keys, 0, 5)
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete("spread-sub") }, "not all acked: %s", func() string { return chk.Missing("spread-sub") })

	partitioned := itest.Delivery != adapter.DeliveryPerKey
	share := func(owners int) int { return (8 + owners - 1) / owners }
	if partitioned {
		// The assignment settles while the rounds above flow: owner
		// records change as the first fences lift, and a receiver follows
		// the assignment as soon as one does, not at its next check a
		// second later, which could move a partition after its last
		// message (its new owner then holds no pin, and no status page
		// names a holder, until the next message). Looped, the spread was
		// there 0.05-0.16 s after the last ack; 10 s leaves room for CI,
		// where this package runs beside the power-cut and cluster
		// packages.
		testutil.Eventually(t, 10*time.Second, func() bool {
			sum := 0
			for _, sc := range scs {
				owned, _ := ownedPartitions(t, sc, "spread-sub")
				if owned > share(3) || owned == 0 {
					return false
				}
				sum += owned
			}
			return sum == 8
		}, "the partitions are not spread over the three sidecars: %s", func() string { return ownership(t, scs) })
		// Every sidecar's status page names who holds each partition.
		for i, sc := range scs {
			testutil.Eventually(t, 10*time.Second, func() bool {
				_, _, holders := partitionHolders(t, sc, "spread-sub")
				return len(holders) == 3 && holders["sidecar-0"]+holders["sidecar-1"]+holders["sidecar-2"] == 8
			}, "sidecar %d's status does not name the three holders: %v", i, func() any { _, _, h := partitionHolders(t, sc, "spread-sub"); return h })
		}
	}
	// The deliveries of a round published once the three receive (the
	// rounds before went partly to whichever started first): each sidecar
	// gets at least half its share.
	var before [3]int64
	for i := range 3 {
		before[i] = got[i].Load()
	}
	itest.PublishChecked(t, pub, chk, keys, 5, 6)
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete("spread-sub") }, "not all acked: %s", func() string { return chk.Missing("spread-sub") })
	for i := range 3 {
		if n := got[i].Load() - before[i]; n < int64(len(keys)/6) {
			t.Errorf("sidecar %d received %d of the %d messages of a round, less than half its share (%d, %d, %d)", i, n, len(keys),
				got[0].Load()-before[0], got[1].Load()-before[1], got[2].Load()-before[2])
		}
	}

	// The third leaves, and then a fourth joins: each time the partitions
	// are rebalanced within 5 s, measured from the change to the moment
	// the messages published right after it are all acked (a sidecar knows
	// it owns a partition once a message of it arrives). Order holds.
	if partitioned {
		next := 6
		round := func() time.Duration {
			start := time.Now()
			itest.PublishChecked(t, pub, chk, keys, next, next+1)
			next++
			testutil.Eventually(t, 30*time.Second, func() bool { return chk.Complete("spread-sub") }, "not all acked: %s", func() string { return chk.Missing("spread-sub") })
			return time.Since(start)
		}
		stops[2]()
		scs[2].Stop()
		left := round()
		testutil.Eventually(t, 5*time.Second, func() bool {
			a, _ := ownedPartitions(t, scs[0], "spread-sub")
			b, _ := ownedPartitions(t, scs[1], "spread-sub")
			return a+b == 8 && a <= share(2) && b <= share(2)
		}, "the two sidecars left do not own every partition: %s", func() string { return ownership(t, scs[:2]) })

		joined := itest.Start(t, sidecar.Config{NATSURL: first.NATS})
		scs[2] = joined
		receive(3, joined)
		// The joining sidecar's receiver starts with the client's stream:
		// from then, messages keep coming until it holds its share.
		var took time.Duration
		start := time.Now()
		for {
			round()
			if owned, _ := ownedPartitions(t, joined, "spread-sub"); owned >= 8/3 {
				took = time.Since(start)
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the joining sidecar did not take its share within 10 s: %s", ownership(t, scs))
			}
		}
		t.Logf("a sidecar left: the next round of %d messages acked %v later; one joined: it held its share %v after it started receiving",
			len(keys), left.Round(time.Millisecond), took.Round(time.Millisecond))
		if left > 5*time.Second || took > 5*time.Second {
			t.Errorf("rebalancing took over 5 s: %v after the leave, %v after the join", left, took)
		}
		if got[3].Load() == 0 {
			t.Error("the joining sidecar received nothing")
		}
	}
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations:\n%s", strings.Join(v, "\n"))
	}
}

func ownership(t *testing.T, scs []*itest.Sidecar) string {
	var parts []string
	for i, sc := range scs {
		owned, total := ownedPartitions(t, sc, "spread-sub")
		parts = append(parts, fmt.Sprintf("sidecar %d owns %d of %d", i, owned, total))
	}
	return strings.Join(parts, ", ")
}
