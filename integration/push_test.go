package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Push subscriptions end to end: the sidecar POSTs every message to an
// HTTP endpoint in the test process (httptest listens on 127.0.0.1, which
// the default --push-allow, loopback, allows) and acks or nacks it by the
// answer. The endpoint feeds every request to an ordercheck.Checker, so
// order, loss and one request in flight per key are checked as for pull;
// the handlers only record, the test goroutine asserts.

// holdPastDeadline is an answer a pushEndpoint's answer func may give
// instead of a status code: none until the sidecar has timed the request
// out (the subscription's ack deadline) and nacked it.
const holdPastDeadline = 0

// isPushAck reports whether Pub/Sub counts status as an ack.
func isPushAck(status int) bool {
	switch status {
	case http.StatusProcessing, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent:
		return true
	}
	return false
}

// pushRequest is one request a pushEndpoint received.
type pushRequest struct {
	path    string
	header  http.Header
	body    []byte
	wrapper *pushWrapper // the decoded body when it is Pub/Sub's JSON wrapper
	key     string       // the message's ordering key
	index   int          // its ordercheck index; -1 when the data is no ordercheck payload
	attempt int          // 1 for the endpoint's first request for (key, index)
	// Guarded by the endpoint's mu: how the request was answered.
	settled bool
	status  int // holdPastDeadline for one held past the deadline
}

// data is the message's data: the wrapper's, or the body.
func (p *pushRequest) data() []byte {
	if p.wrapper != nil {
		return p.wrapper.Message.Data
	}
	return p.body
}

// pushWrapper is the body of a wrapped push request.
type pushWrapper struct {
	Message struct {
		Data        []byte            `json:"data"`
		Attributes  map[string]string `json:"attributes"`
		MessageID   string            `json:"messageId"`
		PublishTime string            `json:"publishTime"`
		OrderingKey string            `json:"orderingKey"`
	} `json:"message"`
	Subscription    string `json:"subscription"`
	DeliveryAttempt int    `json:"deliveryAttempt"`
}

// pushEndpoint is a push subscription's HTTP endpoint. The fields before
// mu are set before startPushEndpoint and read-only afterwards.
type pushEndpoint struct {
	// chk, when set, sees every request whose data is an ordercheck
	// payload as a delivery to subscription sub, acked when the answer is
	// an ack and released otherwise.
	chk *ordercheck.Checker
	sub string
	// answer says how to answer a request: a status code or
	// holdPastDeadline. It runs in the handler and may block (until ctx,
	// the request's, ends when the sidecar gives up). nil acks everything.
	answer func(ctx context.Context, p *pushRequest) int
	// ackDeadline is the subscription's: how long holdPastDeadline holds.
	ackDeadline time.Duration

	url string // set by startPushEndpoint

	mu       sync.Mutex
	requests []*pushRequest
	attempts map[string]int // "key|index": requests so far
	inFlight map[string]int // ordering key ("" for unkeyed): requests the sidecar waits for
	keyedNow int            // keyed requests the sidecar waits for
	maxKeyed int            // the most keyed requests at once
	maxOfKey int            // the most requests at once for one ordering key
}

// startPushEndpoint serves e on 127.0.0.1 until the test ends.
func startPushEndpoint(t *testing.T, e *pushEndpoint) *pushEndpoint {
	t.Helper()
	e.attempts, e.inFlight = map[string]int{}, map[string]int{}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/push"
	return e
}

func (e *pushEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the sidecar went away mid-request (SIGKILL): nothing was delivered
	}
	p := e.arrive(r, body)
	status := http.StatusNoContent
	if e.answer != nil {
		status = e.answer(r.Context(), p)
	}
	if status == holdPastDeadline {
		e.holdPastDeadline(r.Context(), p)
		return
	}
	// Recorded before the answer goes: with it the sidecar may send the
	// key's next message at once.
	e.leave(p, status)
	w.WriteHeader(status)
}

// arrive records a request and checks that no other request of its
// ordering key is in flight.
func (e *pushEndpoint) arrive(r *http.Request, body []byte) *pushRequest {
	p := &pushRequest{path: r.URL.Path, header: r.Header.Clone(), body: body, index: -1}
	// A wrapper always names the subscription; other JSON is data.
	if w := new(pushWrapper); r.Header.Get("Content-Type") == "application/json" && json.Unmarshal(body, w) == nil && w.Subscription != "" {
		p.wrapper, p.key = w, w.Message.OrderingKey
	} else {
		p.key = r.Header.Get("x-goog-pubsub-ordering-key")
	}
	if key, index, err := ordercheck.Decode(p.data()); err == nil && key == p.key {
		p.index = index
	} else if e.chk != nil {
		e.chk.Fail("%s: push request %q (ordering key %q) carries no ordercheck payload", e.sub, body, p.key)
	}
	e.mu.Lock()
	id := p.key + "|" + strconv.Itoa(p.index)
	e.attempts[id]++
	p.attempt = e.attempts[id]
	e.requests = append(e.requests, p)
	e.inFlight[p.key]++
	overlap := 0
	if p.key != "" {
		overlap = e.inFlight[p.key]
		e.maxOfKey = max(e.maxOfKey, overlap)
		e.keyedNow++
		e.maxKeyed = max(e.maxKeyed, e.keyedNow)
	}
	e.mu.Unlock()
	if e.chk != nil && p.index >= 0 {
		if overlap > 1 {
			e.chk.Fail("%s: key %q message %d pushed while %d other request(s) of the key are in flight", e.sub, p.key, p.index, overlap-1)
		}
		e.chk.Delivered(e.sub, p.key, p.index)
	}
	return p
}

// leave records p's answer: from here the sidecar no longer waits for it.
func (e *pushEndpoint) leave(p *pushRequest, status int) {
	e.mu.Lock()
	p.settled, p.status = true, status
	e.inFlight[p.key]--
	if p.key != "" {
		e.keyedNow--
	}
	e.mu.Unlock()
	if e.chk != nil && p.index >= 0 {
		if isPushAck(status) {
			e.chk.Acked(e.sub, p.key, p.index)
		} else {
			e.chk.Released(e.sub, p.key, p.index)
		}
	}
}

// holdPastDeadline answers p only once the sidecar has given up on it.
// The sidecar's timeout starts before it sends the request, so its nack,
// and a redelivery, may come a little before the deadline has passed
// here: p counts as in flight (a second request of its key is a
// violation) for half the deadline, while the sidecar surely still waits,
// and is released then. The handler stays until the sidecar closes the
// connection; what it might answer after that is never read, so p is not
// acked.
func (e *pushEndpoint) holdPastDeadline(ctx context.Context, p *pushRequest) {
	surelyWaiting := time.NewTimer(e.ackDeadline / 2)
	defer surelyWaiting.Stop()
	select {
	case <-surelyWaiting.C:
	case <-ctx.Done():
	}
	e.leave(p, holdPastDeadline)
	tooLate := time.NewTimer(e.ackDeadline + 10*time.Second)
	defer tooLate.Stop()
	select {
	case <-ctx.Done():
	case <-tooLate.C:
		if e.chk != nil {
			e.chk.Fail("%s: key %q message %d: the request is still open %v after its ack deadline", e.sub, p.key, p.index, e.ackDeadline+10*time.Second)
		}
	}
}

// count returns how many requests match.
func (e *pushEndpoint) count(match func(p *pushRequest) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, p := range e.requests {
		if match(p) {
			n++
		}
	}
	return n
}

// received returns copies of the requests so far, in arrival order.
func (e *pushEndpoint) received() []pushRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]pushRequest, len(e.requests))
	for i, p := range e.requests {
		out[i] = *p
	}
	return out
}

// inFlightNow is how many requests the sidecar waits for: keyed ones,
// and all.
func (e *pushEndpoint) inFlightNow() (keyed, all int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range e.inFlight {
		all += v
	}
	return e.keyedNow, all
}

// concurrency returns the most keyed requests in flight at once, and the
// most of a single key.
func (e *pushEndpoint) concurrency() (keyed, ofOneKey int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.maxKeyed, e.maxOfKey
}

func acked(p *pushRequest) bool { return p.settled && isPushAck(p.status) }

// orderingKeys returns n ordering keys, key-00, key-01, ...
func orderingKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	return keys
}

// orderedPublisher is Google's publisher with ordering enabled.
func orderedPublisher(t *testing.T, c *pubsub.Client, topic string) *pubsub.Publisher {
	pub := c.Publisher(topic)
	pub.EnableMessageOrdering = true
	t.Cleanup(pub.Stop)
	return pub
}

func waitComplete(t *testing.T, chk *ordercheck.Checker, sub string, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() bool { return chk.Complete(sub) },
		"%s: not acked: %s", sub, func() string { return chk.Missing(sub) })
}

func assertInOrder(t *testing.T, chk *ordercheck.Checker) {
	t.Helper()
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d violations:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// pushFailures reads the sidecar's jetorder_push_failures_total of a
// subscription.
func pushFailures(sc *itest.Sidecar, sub string) int {
	n, _ := sc.Metrics().Value("jetorder_push_failures_total", "subscription", subPath(sub))
	return int(n)
}

func pushTo(url string) *pb.PushConfig { return &pb.PushConfig{PushEndpoint: url} }

// An ordered push subscription whose endpoint fails about one request in
// ten with a 500 and lets about one in fifty run past the ack deadline
// (decided by a hash of key, index and attempt, so a run is
// reproducible): every message is acked in the end, each key's in publish
// order, and never two requests of a key in flight at once. The retry
// policy's short backoffs keep it quick (the adapter delays the
// redelivery).
func TestPushFlakyEndpointKeepsOrder(t *testing.T) {
	const seed, deadline = 7, 2 * time.Second
	chk := ordercheck.New()
	e := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: "flaky-sub", ackDeadline: deadline,
		answer: func(_ context.Context, p *pushRequest) int {
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%s|%d|%d", seed, p.key, p.index, p.attempt)
			switch v := h.Sum64() % 100; {
			case v < 2:
				return holdPastDeadline
			case v < 12:
				return http.StatusInternalServerError
			}
			return http.StatusOK
		}})
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "flaky")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("flaky-sub"), Topic: topicPath("flaky"), EnableMessageOrdering: true,
		AckDeadlineSeconds: int32(deadline / time.Second), PushConfig: pushTo(e.url),
		RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(10 * time.Millisecond), MaximumBackoff: durationpb.New(100 * time.Millisecond)}})

	start := time.Now()
	pub := orderedPublisher(t, c, "flaky")
	itest.PublishChecked(t, pub, chk, orderingKeys(20), 0, 30)
	itest.PublishChecked(t, pub, chk, []string{""}, 0, 50)
	waitComplete(t, chk, "flaky-sub", 90*time.Second)
	assertInOrder(t, chk)

	failed := e.count(func(p *pushRequest) bool { return p.settled && p.status == http.StatusInternalServerError })
	timedOut := e.count(func(p *pushRequest) bool { return p.settled && p.status == holdPastDeadline })
	if failed == 0 || timedOut == 0 {
		t.Fatalf("the endpoint failed %d requests and held %d past the deadline: the test did not exercise failures", failed, timedOut)
	}
	if _, ofOneKey := e.concurrency(); ofOneKey > 1 {
		t.Fatalf("%d requests of one key in flight at once", ofOneKey)
	}
	st := chk.Stats("flaky-sub")
	t.Logf("650 messages acked in %v: %d requests, %d answered 500, %d held past the %v deadline, %d redeliveries",
		time.Since(start).Round(time.Millisecond), st.Deliveries, failed, timedOut, deadline, st.Redeliveries)
}

// Two push subscriptions on one topic: one endpoint holds every keyed
// request until the test lets go, the other answers at once. The fast
// subscription gets everything while the slow one has acked no keyed
// message; the slow one's unkeyed messages do not wait behind its held
// keys (they have a budget of their own); it has at most
// --push-max-outstanding keyed requests in flight; the sidecar keeps
// answering. Let go, the slow one catches up, in order.
func TestPushSlowEndpointHoldsUpNothingElse(t *testing.T) {
	const budget, keys, perKey, unkeyed = 4, 10, 10, 30
	chk := ordercheck.New()
	letGo := make(chan struct{})
	var letGoOnce sync.Once
	slow := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: "slow-sub",
		answer: func(ctx context.Context, p *pushRequest) int {
			if p.key == "" {
				return http.StatusOK
			}
			select {
			case <-letGo:
				return http.StatusOK
			case <-ctx.Done():
				return http.StatusServiceUnavailable
			}
		}})
	t.Cleanup(func() { letGoOnce.Do(func() { close(letGo) }) }) // before the endpoint's server waits for its handlers
	fast := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: "fast-sub"})
	sc := itest.Start(t, sidecar.Config{PushMaxOutstanding: budget})
	c := sc.GoClient()
	mustCreateTopic(t, c, "speeds")
	// The slow endpoint's held requests must not time out.
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("slow-sub"), Topic: topicPath("speeds"), EnableMessageOrdering: true,
		AckDeadlineSeconds: 120, PushConfig: pushTo(slow.url)})
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("fast-sub"), Topic: topicPath("speeds"), EnableMessageOrdering: true,
		PushConfig: pushTo(fast.url)})

	start := time.Now()
	pub := orderedPublisher(t, c, "speeds")
	itest.PublishChecked(t, pub, chk, orderingKeys(keys), 0, perKey)
	itest.PublishChecked(t, pub, chk, []string{""}, 0, unkeyed)
	waitComplete(t, chk, "fast-sub", 20*time.Second)
	fastTook := time.Since(start)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return slow.count(func(p *pushRequest) bool { return p.key == "" && acked(p) }) >= unkeyed
	}, "the slow subscription's unkeyed messages wait behind its held keys: %d of %d acked",
		func() int { return slow.count(func(p *pushRequest) bool { return p.key == "" && acked(p) }) }, unkeyed)
	heldKeyed := func() int { keyed, _ := slow.inFlightNow(); return keyed }
	testutil.Eventually(t, 10*time.Second, func() bool { return heldKeyed() == budget },
		"the slow endpoint holds %d keyed requests, want the budget, %d", heldKeyed, budget)
	if n := slow.count(func(p *pushRequest) bool { return p.key != "" && p.settled }); n != 0 {
		t.Fatalf("the slow endpoint answered %d keyed requests while holding them all", n)
	}

	// The sidecar answers while the slow endpoint holds its requests.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for what, call := range map[string]func() error{
		"GetSubscription": func() error {
			_, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath("slow-sub")})
			return err
		},
		"Publish": func() error {
			chk.Published("key-00", perKey)
			_, err := pub.Publish(ctx, &pubsub.Message{Data: ordercheck.Encode("key-00", perKey), OrderingKey: "key-00"}).Get(ctx)
			return err
		},
	} {
		began := time.Now()
		if err := call(); err != nil {
			t.Fatalf("%s while the slow endpoint holds its requests: %v", what, err)
		}
		if took := time.Since(began); took > 3*time.Second {
			t.Fatalf("%s took %v while the slow endpoint holds its requests", what, took)
		}
	}
	waitComplete(t, chk, "fast-sub", 10*time.Second)

	letGoOnce.Do(func() { close(letGo) })
	waitComplete(t, chk, "slow-sub", 30*time.Second)
	assertInOrder(t, chk)
	if keyed, ofOneKey := slow.concurrency(); keyed > budget || ofOneKey > 1 {
		t.Fatalf("the slow endpoint had %d keyed requests in flight at once (budget %d), %d of one key", keyed, budget, ofOneKey)
	}
	t.Logf("fast subscription complete after %v; slow one after %v (held until let go)", fastTook.Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond))
}

// An endpoint where nothing listens: the messages wait (push backoff,
// held in the sidecar: no retry policy), nothing is lost, and once
// ModifyPushConfig names a live endpoint everything arrives there, each
// key in order.
func TestPushDeadEndpointLosesNothing(t *testing.T) {
	chk := ordercheck.New()
	live := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: "dead-end-sub"})
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	ctx := context.Background()
	dead := "http://" + itest.FreeAddr(t) + "/push"
	mustCreateTopic(t, c, "dead-end")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("dead-end-sub"), Topic: topicPath("dead-end"), EnableMessageOrdering: true,
		PushConfig: pushTo(dead)})
	pub := orderedPublisher(t, c, "dead-end")
	itest.PublishChecked(t, pub, chk, append(orderingKeys(5), ""), 0, 10)
	testutil.Eventually(t, 10*time.Second, func() bool { return pushFailures(sc, "dead-end-sub") >= 10 },
		"the sidecar has not tried the dead endpoint: %d push failures", func() int { return pushFailures(sc, "dead-end-sub") })

	if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{
		Subscription: subPath("dead-end-sub"), PushConfig: pushTo(live.url)}); err != nil {
		t.Fatal(err)
	}
	got, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath("dead-end-sub")})
	if err != nil || got.GetPushConfig().GetPushEndpoint() != live.url {
		t.Fatalf("after ModifyPushConfig: push_config %v, %v", got.GetPushConfig(), err)
	}
	waitComplete(t, chk, "dead-end-sub", 30*time.Second)
	assertInOrder(t, chk)
	if _, ofOneKey := live.concurrency(); ofOneKey > 1 {
		t.Fatalf("%d requests of one key in flight at once", ofOneKey)
	}
}

// An endpoint that fails every request, on a subscription with a
// dead-letter policy of 5 attempts: each message is pushed 5 times, with
// deliveryAttempt 1 to 5 in the wrapper, then goes to the dead-letter
// topic, and its key moves on to the next message.
func TestPushFailingEndpointDeadLetters(t *testing.T) {
	failing := startPushEndpoint(t, &pushEndpoint{ // no checker: a dead-lettered message moves its key on unacked
		answer: func(context.Context, *pushRequest) int { return http.StatusInternalServerError }})
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "poison")
	mustCreateTopic(t, c, "poison-dead")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("poison-dead-sub"), Topic: topicPath("poison-dead")})
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("poison-sub"), Topic: topicPath("poison"), EnableMessageOrdering: true,
		PushConfig: pushTo(failing.url), DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath("poison-dead"), MaxDeliveryAttempts: 5}})
	pub := orderedPublisher(t, c, "poison")
	itest.PublishChecked(t, pub, nil, []string{"k", ""}, 0, 2)

	dead := receiveAll(t, c.Subscriber("poison-dead-sub"), 4, nil)
	var deadData []string
	for _, m := range dead {
		deadData = append(deadData, string(m.Data))
		if m.Attributes["CloudPubSubDeadLetterSourceSubscription"] != subPath("poison-sub") ||
			m.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" {
			t.Errorf("dead-lettered %q: attributes %v", m.Data, m.Attributes)
		}
	}
	slices.Sort(deadData)
	if want := []string{"k|0", "k|1", "|0", "|1"}; !slices.Equal(deadData, want) {
		t.Fatalf("dead-lettered %q, want %q", deadData, want)
	}

	attempts := map[string][]int{}
	var keyed []int
	for _, p := range failing.received() {
		if p.wrapper == nil {
			t.Fatalf("not a wrapped request: %s", p.body)
		}
		id := p.key + "|" + strconv.Itoa(p.index)
		attempts[id] = append(attempts[id], p.wrapper.DeliveryAttempt)
		if p.key == "k" {
			keyed = append(keyed, p.index)
		}
	}
	for id, a := range attempts {
		if !slices.Equal(a, []int{1, 2, 3, 4, 5}) {
			t.Errorf("message %s: pushed with deliveryAttempt %v, want 1 to 5", id, a)
		}
	}
	if want := []int{0, 0, 0, 0, 0, 1, 1, 1, 1, 1}; !slices.Equal(keyed, want) {
		t.Errorf("key k's requests were for messages %v, want %v", keyed, want)
	}
}

// The sidecar binary is killed with SIGKILL while it has a push request
// of every key in flight (the endpoint holds them once 300 messages are
// acked) and restarted on the same data dir and ports: it pushes again by
// itself, nothing is lost, and each key goes on in order (from a message
// acked before, if the kill lost that ack).
func TestPushSurvivesSIGKILL(t *testing.T) {
	const keys, perKey, unkeyed, acksBeforeKill = 10, 100, 50, 300
	chk := ordercheck.New()
	var requests atomic.Int64
	var restarted atomic.Bool
	e := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: "killed-push-sub",
		answer: func(ctx context.Context, p *pushRequest) int {
			if restarted.Load() || requests.Add(1) <= acksBeforeKill {
				return http.StatusOK
			}
			<-ctx.Done() // held until the sidecar is gone
			return http.StatusServiceUnavailable
		}})
	a := itest.Start(t, sidecar.Config{PushAllow: "loopback"}, itest.Binary(itest.BuildSidecar(t)))
	c := a.GoClient()
	mustCreateTopic(t, c, "killed-push")
	// A message in flight at the kill comes back once its ack deadline has
	// passed: a short one keeps the test quick.
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("killed-push-sub"), Topic: topicPath("killed-push"), EnableMessageOrdering: true,
		AckDeadlineSeconds: 5, PushConfig: pushTo(e.url)})
	pub := orderedPublisher(t, c, "killed-push")
	itest.PublishChecked(t, pub, chk, orderingKeys(keys), 0, perKey)
	itest.PublishChecked(t, pub, chk, []string{""}, 0, unkeyed)
	held := func() int { keyed, _ := e.inFlightNow(); return keyed }
	testutil.Eventually(t, 60*time.Second, func() bool { return held() >= keys },
		"not every key has a request held: %d requests, %d keyed ones in flight", requests.Load, held)

	chk.AcksMayBeLost()
	killedAt := time.Now()
	a.Kill()
	// The held requests end with the dead process's connections; only
	// then may the restarted sidecar push their keys again.
	open := func() int { _, all := e.inFlightNow(); return all }
	testutil.Eventually(t, 10*time.Second, func() bool { return open() == 0 }, "%d requests still open after the kill", open)
	restarted.Store(true)
	b := a.Restart()
	itest.PublishChecked(t, pub, chk, orderingKeys(keys), perKey, perKey+10)
	waitComplete(t, chk, "killed-push-sub", 60*time.Second)
	assertInOrder(t, chk)
	if _, ofOneKey := e.concurrency(); ofOneKey > 1 {
		t.Fatalf("%d requests of one key in flight at once", ofOneKey)
	}
	st := chk.Stats("killed-push-sub")
	t.Logf("killed after %d acks; all %d messages acked %v after the kill; %d requests, %d redeliveries, %d keys went back to a message acked before",
		acksBeforeKill, keys*(perKey+10)+unkeyed, time.Since(killedAt).Round(time.Millisecond), st.Deliveries, st.Redeliveries, st.Rewinds)
	b.Stop()
}

// Endpoints --push-allow does not allow, and push configs the sidecar
// cannot serve, are INVALID_ARGUMENT at creation (nothing is created) and
// at update (nothing changes).
func TestPushConfigRefused(t *testing.T) {
	ctx := context.Background()
	// refusedAtCreate asserts that creating sub fails and leaves nothing.
	refusedAtCreate := func(t *testing.T, c *pubsub.Client, what string, sub *pb.Subscription) error {
		t.Helper()
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, sub)
		wantCode(t, what, err, codes.InvalidArgument)
		_, gerr := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub.Name})
		wantCode(t, what+": the subscription after the refusal", gerr, codes.NotFound)
		return err
	}
	notAllowed := func(t *testing.T, what string, err error) {
		t.Helper()
		wantCode(t, what, err, codes.InvalidArgument)
		if !strings.Contains(err.Error(), "--push-allow") {
			t.Errorf("%s: %v does not name the flag that would allow it", what, err)
		}
	}
	modify := func(c *pubsub.Client, sub string, pc *pb.PushConfig) error {
		return c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: subPath(sub), PushConfig: pc})
	}
	get := func(t *testing.T, c *pubsub.Client, sub string) *pb.Subscription {
		t.Helper()
		s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(sub)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const local = "http://127.0.0.1:9/push" // allowed; nothing is published, so nothing is pushed

	t.Run("loopback", func(t *testing.T) {
		c := itest.Start(t, sidecar.Config{}).GoClient()
		mustCreateTopic(t, c, "guarded")
		sub := func(id string, pc *pb.PushConfig, labels map[string]string) *pb.Subscription {
			return &pb.Subscription{Name: subPath(id), Topic: topicPath("guarded"), PushConfig: pc, Labels: labels}
		}
		for _, tc := range []struct {
			id         string
			pc         *pb.PushConfig
			labels     map[string]string
			notAllowed bool // the error names --push-allow
		}{
			{"public-host", pushTo("https://example.com/push"), nil, true},
			{"private-address", pushTo("http://10.1.2.3/x"), nil, true},
			{"scheme-ftp", pushTo("ftp://127.0.0.1/x"), nil, false},
			{"user-info", pushTo("http://user:pw@127.0.0.1/x"), nil, false},
			{"format-label-xml", pushTo(local), map[string]string{"jetorder-push-format": "xml"}, false},
			{"cloudevents-and-no-wrapper", &pb.PushConfig{PushEndpoint: local, Wrapper: &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{}}},
				map[string]string{"jetorder-push-format": "cloudevents"}, false},
			{"version-v1beta1", &pb.PushConfig{PushEndpoint: local, Attributes: map[string]string{"x-goog-version": "v1beta1"}}, nil, false},
		} {
			err := refusedAtCreate(t, c, tc.id, sub(tc.id, tc.pc, tc.labels))
			if tc.notAllowed {
				notAllowed(t, tc.id, err)
			}
		}

		// A pull subscription stays one.
		mustCreateSub(t, c, sub("pull-sub", nil, nil))
		notAllowed(t, "ModifyPushConfig to a public host", modify(c, "pull-sub", pushTo("https://example.com/push")))
		_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: sub("pull-sub", pushTo("http://10.1.2.3/x"), nil), UpdateMask: fieldMask("push_config")})
		notAllowed(t, "UpdateSubscription to a private address", err)
		if pc := get(t, c, "pull-sub").GetPushConfig(); !proto.Equal(pc, &pb.PushConfig{}) {
			t.Fatalf("pull subscription after refused updates: push_config %v", pc)
		}

		// A push subscription keeps its config.
		kept := &pb.PushConfig{PushEndpoint: local, Wrapper: &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}}}
		mustCreateSub(t, c, sub("push-sub", kept, nil))
		labelsBefore := get(t, c, "push-sub").GetLabels()
		notAllowed(t, "ModifyPushConfig to a public host", modify(c, "push-sub", pushTo("https://example.com/push")))
		wantCode(t, "ModifyPushConfig to x-goog-version v1beta1", modify(c, "push-sub",
			&pb.PushConfig{PushEndpoint: local, Attributes: map[string]string{"x-goog-version": "v1beta1"}}), codes.InvalidArgument)
		withCE := map[string]string{"jetorder-push-format": "cloudevents"}
		for k, v := range labelsBefore {
			withCE[k] = v
		}
		_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: sub("push-sub", nil, withCE), UpdateMask: fieldMask("labels")})
		wantCode(t, "the cloudevents label on a no_wrapper subscription", err, codes.InvalidArgument)
		after := get(t, c, "push-sub")
		if !proto.Equal(after.GetPushConfig(), kept) || after.GetLabels()["jetorder-push-format"] != "" {
			t.Fatalf("push subscription after refused updates: push_config %v, labels %v", after.GetPushConfig(), after.GetLabels())
		}
		// localhost is loopback too; v1 is the format the sidecar speaks.
		v1 := &pb.PushConfig{PushEndpoint: "http://localhost:9/other", Attributes: map[string]string{"x-goog-version": "v1"},
			Wrapper: &pb.PushConfig_PubsubWrapper_{PubsubWrapper: &pb.PushConfig_PubsubWrapper{}}}
		if err := modify(c, "push-sub", v1); err != nil {
			t.Fatalf("ModifyPushConfig to localhost: %v", err)
		}
		if pc := get(t, c, "push-sub").GetPushConfig(); !proto.Equal(pc, v1) {
			t.Fatalf("push_config %v, want %v", pc, v1)
		}
	})

	t.Run("off", func(t *testing.T) {
		c := itest.Start(t, sidecar.Config{PushAllow: "off"}).GoClient()
		mustCreateTopic(t, c, "guarded")
		refusedAtCreate(t, c, "a loopback endpoint with push off",
			&pb.Subscription{Name: subPath("push-sub"), Topic: topicPath("guarded"), PushConfig: pushTo(local)})
		mustCreateSub(t, c, &pb.Subscription{Name: subPath("pull-sub"), Topic: topicPath("guarded")})
		wantCode(t, "ModifyPushConfig to loopback with push off", modify(c, "pull-sub", pushTo(local)), codes.InvalidArgument)
		if err := modify(c, "pull-sub", &pb.PushConfig{}); err != nil {
			t.Fatalf("ModifyPushConfig to pull with push off: %v", err)
		}
	})

	t.Run("one address", func(t *testing.T) {
		c := itest.Start(t, sidecar.Config{PushAllow: "127.0.0.1"}).GoClient()
		mustCreateTopic(t, c, "guarded")
		for i, endpoint := range []string{"http://localhost:9/x", "http://127.0.0.2:9/x", "http://[::1]:9/x"} {
			_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
				Name: subPath(fmt.Sprintf("refused-%d", i)), Topic: topicPath("guarded"), PushConfig: pushTo(endpoint)})
			notAllowed(t, endpoint+" with --push-allow 127.0.0.1", err)
		}
		mustCreateSub(t, c, &pb.Subscription{Name: subPath("allowed"), Topic: topicPath("guarded"), PushConfig: pushTo(local)})
	})
}

// What the endpoint receives in each request format, for a message with
// attributes and an ordering key, and for one that is a CloudEvent in
// Pub/Sub's binding. Each subscription answers with another of the codes
// Pub/Sub counts as an ack; a key's next message comes only after an ack,
// so its arrival shows the code was taken as one.
func TestPushRequestFormats(t *testing.T) {
	ackCode := map[string]int{"/wrapper": http.StatusOK, "/dead-letter": http.StatusCreated, "/plain": http.StatusAccepted,
		"/metadata": http.StatusNoContent, "/cloudevents": http.StatusProcessing}
	e := startPushEndpoint(t, &pushEndpoint{answer: func(_ context.Context, p *pushRequest) int { return ackCode[p.path] }})
	base := strings.TrimSuffix(e.url, "/push")
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	ctx := context.Background()
	mustCreateTopic(t, c, "formats")
	mustCreateTopic(t, c, "formats-dead")
	noWrapper := func(meta bool) *pb.PushConfig_NoWrapper_ {
		return &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: meta}}
	}
	for _, s := range []*pb.Subscription{
		{Name: subPath("wrapper"), PushConfig: pushTo(base + "/wrapper")},
		{Name: subPath("dead-letter"), PushConfig: pushTo(base + "/dead-letter"),
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath("formats-dead"), MaxDeliveryAttempts: 5}},
		{Name: subPath("plain"), PushConfig: &pb.PushConfig{PushEndpoint: base + "/plain", Wrapper: noWrapper(false)}},
		{Name: subPath("metadata"), PushConfig: &pb.PushConfig{PushEndpoint: base + "/metadata", Wrapper: noWrapper(true)}},
		{Name: subPath("cloudevents"), PushConfig: pushTo(base + "/cloudevents"), Labels: map[string]string{"jetorder-push-format": "cloudevents"}},
	} {
		s.Topic, s.EnableMessageOrdering = topicPath("formats"), true
		mustCreateSub(t, c, s)
	}

	pub := orderedPublisher(t, c, "formats")
	publish := func(m *pubsub.Message) string {
		id, err := pub.Publish(ctx, m).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	plainID := publish(&pubsub.Message{Data: []byte("hello"), OrderingKey: "k", Attributes: map[string]string{"color": "blue"}})
	publish(&pubsub.Message{Data: []byte(`{"x":1}`), Attributes: map[string]string{
		"ce-specversion": "1.0", "ce-id": "ev-1", "ce-type": "com.example.thing", "ce-source": "/things",
		"ce-subject": "a b", "content-type": "application/json", "other": "not part of the event"}})
	publish(&pubsub.Message{Data: []byte("bye"), OrderingKey: "k"})
	published := time.Now()

	byPath := func() map[string][]pushRequest {
		m := map[string][]pushRequest{}
		for _, p := range e.received() {
			m[p.path] = append(m[p.path], p)
		}
		return m
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		for path := range ackCode {
			if len(byPath()[path]) < 3 {
				return false
			}
		}
		return true
	}, "requests so far: %v", func() map[string]int {
		n := map[string]int{}
		for path, ps := range byPath() {
			n[path] = len(ps)
		}
		return n
	})
	all := byPath()
	// request returns path's request whose body (or wrapped data) is data.
	request := func(path, data string) pushRequest {
		t.Helper()
		var found []pushRequest
		for _, p := range all[path] {
			if string(p.data()) == data {
				found = append(found, p)
			}
		}
		if len(found) != 1 {
			t.Fatalf("%s: %d requests with data %q, want 1", path, len(found), data)
		}
		return found[0]
	}
	for path, ps := range all {
		var keyK []string // no_wrapper without metadata does not say the key: by data
		for _, p := range ps {
			if d := string(p.data()); d == "hello" || d == "bye" {
				keyK = append(keyK, d)
			}
		}
		if len(ps) != 3 || !slices.Equal(keyK, []string{"hello", "bye"}) {
			t.Fatalf("%s: %d requests, of key k %q: want one per message, hello before bye (answered %d)", path, len(ps), keyK, ackCode[path])
		}
	}
	checkPublishTime := func(what, s string) {
		t.Helper()
		if pt := mustParseTime(t, s); pt.After(published) || published.Sub(pt) > time.Minute {
			t.Errorf("%s: publish time %q, published by %v", what, s, published)
		}
	}

	// The JSON wrapper, by its JSON field names.
	w := request("/wrapper", "hello")
	if w.wrapper == nil {
		t.Fatalf("wrapper: not the JSON wrapper: %v %s", w.header, w.body)
	}
	var raw map[string]json.RawMessage
	var m map[string]any
	if err := json.Unmarshal(w.body, &raw); err != nil || json.Unmarshal(raw["message"], &m) != nil {
		t.Fatalf("wrapper body %s: %v", w.body, err)
	}
	if ct := w.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("wrapper: Content-Type %q", ct)
	}
	if _, ok := raw["deliveryAttempt"]; ok {
		t.Errorf("wrapper without a dead-letter policy has deliveryAttempt: %s", w.body)
	}
	if m["data"] != base64.StdEncoding.EncodeToString([]byte("hello")) ||
		m["messageId"] != plainID || m["message_id"] != plainID || m["publishTime"] != m["publish_time"] ||
		m["orderingKey"] != "k" || fmt.Sprint(m["attributes"]) != "map[color:blue]" || w.wrapper.Subscription != subPath("wrapper") {
		t.Errorf("wrapper body: %s", w.body)
	}
	checkPublishTime("wrapper", w.wrapper.Message.PublishTime)
	if d := request("/dead-letter", "hello"); d.wrapper == nil || d.wrapper.DeliveryAttempt != 1 || d.wrapper.Subscription != subPath("dead-letter") {
		t.Errorf("wrapper with a dead-letter policy: %s", d.body)
	}

	// no_wrapper: the data, and only with write_metadata the attributes
	// and metadata as headers.
	plain := request("/plain", "hello")
	for h := range plain.header {
		if strings.HasPrefix(strings.ToLower(h), "x-goog-pubsub-") || strings.EqualFold(h, "color") {
			t.Errorf("no_wrapper without write_metadata sent header %s: %v", h, plain.header)
		}
	}
	meta := request("/metadata", "hello")
	for h, want := range map[string]string{"color": "blue", "x-goog-pubsub-subscription-name": subPath("metadata"),
		"x-goog-pubsub-message-id": plainID, "x-goog-pubsub-ordering-key": "k", "x-goog-pubsub-delivery-attempt": ""} {
		if got := meta.header.Get(h); got != want {
			t.Errorf("no_wrapper with write_metadata: header %s is %q, want %q", h, got, want)
		}
	}
	checkPublishTime("write_metadata", meta.header.Get("x-goog-pubsub-publish-time"))

	// CloudEvents binary mode, read with the CloudEvents SDK: a plain
	// message in Eventarc's envelope, a CloudEvent as itself.
	readEvent := func(p pushRequest) *event.Event {
		t.Helper()
		m, err := newHTTPBindingMessage(&http.Request{Header: p.header, Body: io.NopCloser(bytes.NewReader(p.body))})
		var ev *event.Event
		if err == nil {
			ev, err = binding.ToEvent(ctx, m)
		}
		if err != nil {
			t.Fatalf("%s: not a CloudEvent: %v (headers %v)", p.path, err, p.header)
		}
		return ev
	}
	env := request("/cloudevents", "hello")
	if env.wrapper == nil || env.wrapper.Message.MessageID != plainID || env.wrapper.Subscription != subPath("cloudevents") ||
		env.wrapper.Message.Attributes["color"] != "blue" || env.wrapper.Message.OrderingKey != "k" {
		t.Fatalf("the envelope's data, the push wrapper: %s", env.body)
	}
	if ev := readEvent(env); ev.ID() != plainID || ev.Type() != "google.cloud.pubsub.topic.v1.messagePublished" || ev.SpecVersion() != "1.0" ||
		ev.Source() != "//pubsub.googleapis.com/"+topicPath("formats") || ev.DataContentType() != "application/json" ||
		!ev.Time().Equal(mustParseTime(t, env.wrapper.Message.PublishTime)) {
		t.Errorf("envelope of a plain message: %v", ev)
	}
	checkPublishTime("envelope", env.wrapper.Message.PublishTime)
	ce := request("/cloudevents", `{"x":1}`)
	if ev := readEvent(ce); ev.ID() != "ev-1" || ev.Type() != "com.example.thing" || ev.Source() != "/things" ||
		ev.DataContentType() != "application/json" || string(ev.Data()) != `{"x":1}` {
		t.Errorf("a CloudEvent message: %v", ev)
	}
	if got := ce.header.Get("ce-subject"); got != "a%20b" {
		t.Errorf("ce-subject %q, want the value percent-encoded, a%%20b", got)
	}
	if ev := readEvent(ce); ev.Subject() != "a b" {
		t.Errorf("subject read back %q, want a b", ev.Subject())
	}
	if got := ce.header.Get("other"); got != "" {
		t.Errorf("an attribute that is not part of the event was sent as a header: %q", got)
	}
}

func mustParseTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return tm
}

// Pull and StreamingPull on a push subscription are FAILED_PRECONDITION.
// ModifyPushConfig to an empty config makes it a pull subscription: a
// Receive gets the messages the endpoint had not acked, in order. Made a
// push subscription again while that Receive runs, the endpoint gets
// every new message and the Receive none; its stream ends with
// FAILED_PRECONDITION once it would have handed one out.
func TestPushAndPullSwitch(t *testing.T) {
	chk := ordercheck.New()
	const sub = "switch-sub"
	refusing := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: sub, answer: func(_ context.Context, p *pushRequest) int {
		if p.index < 2 {
			return http.StatusOK
		}
		return http.StatusInternalServerError
	}})
	acking := startPushEndpoint(t, &pushEndpoint{chk: chk, sub: sub})
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	_, subc := sc.RawClients()
	ctx := context.Background()
	mustCreateTopic(t, c, "switch")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath(sub), Topic: topicPath("switch"), EnableMessageOrdering: true, PushConfig: pushTo(refusing.url)})
	pub := orderedPublisher(t, c, "switch")
	itest.PublishChecked(t, pub, chk, []string{"k"}, 0, 5)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return refusing.count(func(p *pushRequest) bool { return p.index == 2 && p.settled }) > 0
	}, "message 2 not refused yet")

	_, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath(sub), MaxMessages: 10})
	wantCode(t, "Pull on a push subscription", err, codes.FailedPrecondition)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = c.Subscriber(sub).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		chk.Fail("Receive on a push subscription got %q", m.Data)
		m.Nack()
	})
	cancel()
	wantCode(t, "Receive (StreamingPull) on a push subscription", err, codes.FailedPrecondition)

	if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: subPath(sub), PushConfig: &pb.PushConfig{}}); err != nil {
		t.Fatal(err)
	}
	var pulledAfterSwitch atomic.Int64
	r := startReceiving(t, func(ctx context.Context) error {
		return c.Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			key, index, err := ordercheck.Decode(m.Data)
			if err != nil {
				chk.Fail("undecodable %q", m.Data)
			}
			if index >= 5 {
				pulledAfterSwitch.Add(1)
			}
			chk.Delivered(sub, key, index)
			chk.Acked(sub, key, index)
			m.Ack()
		})
	})
	waitComplete(t, chk, sub, 20*time.Second)

	if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: subPath(sub), PushConfig: pushTo(acking.url)}); err != nil {
		t.Fatal(err)
	}
	itest.PublishChecked(t, pub, chk, []string{"k"}, 5, 10)
	waitComplete(t, chk, sub, 20*time.Second)
	assertInOrder(t, chk)
	if n := pulledAfterSwitch.Load(); n != 0 {
		t.Fatalf("Receive got %d messages published after the switch to push", n)
	}
	if n := acking.count(acked); n != 5 {
		t.Fatalf("the endpoint acked %d requests after the switch, want 5", n)
	}
	// Ended by itself or not, the Receive must not end otherwise.
	if err := r.stop(); err != nil {
		wantCode(t, "Receive after the switch to push", err, codes.FailedPrecondition)
		t.Log("the Receive running at the switch ended with FAILED_PRECONDITION")
	} else {
		t.Log("the Receive running at the switch got no message and ran on")
	}
}

// The push_config a subscription is created or updated with reads back as
// in Google's fake (pstest), which keeps it without pushing: the endpoint,
// attributes, no_wrapper and write_metadata, the oidc_token (which the
// sidecar keeps but sends no token for), and pubsub_wrapper when no
// wrapper is given. Where they differ the test says so.
func TestPushConfigParity(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		admin := b.client.SubscriptionAdminClient
		mustCreateTopic(t, b.client, "configs")
		const endpoint = "http://127.0.0.1:9/push" // nothing is published, so nothing is pushed
		wrapped := &pb.PushConfig{PushEndpoint: endpoint, Wrapper: &pb.PushConfig_PubsubWrapper_{PubsubWrapper: &pb.PushConfig_PubsubWrapper{}}}
		full := &pb.PushConfig{PushEndpoint: endpoint + "/full", Attributes: map[string]string{"x-goog-version": "v1"},
			Wrapper: &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}},
			AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{
				ServiceAccountEmail: "pusher@test-project.iam.gserviceaccount.com", Audience: "https://app.example"}}}
		dataOnly := &pb.PushConfig{PushEndpoint: endpoint, Wrapper: &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{}}}
		// expect checks the config returned by a call and read back.
		expect := func(what, id string, returned *pb.Subscription, want *pb.PushConfig) {
			t.Helper()
			got, err := admin.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub(id)})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []*pb.Subscription{returned, got} {
				if s != nil && !proto.Equal(s.GetPushConfig(), want) {
					t.Errorf("%s: push_config %v, want %v", what, s.GetPushConfig(), want)
				}
			}
		}
		defaultWrapped := wrapped
		if b.emulator {
			defaultWrapped = pushTo(endpoint) // Google's emulator adds no pubsub_wrapper
		}
		for _, tc := range []struct {
			id       string
			in, want *pb.PushConfig
		}{
			{"push-default", pushTo(endpoint), defaultWrapped},
			{"push-full", full, full},
			{"push-data-only", dataOnly, dataOnly},
			{"pull", nil, &pb.PushConfig{}},
		} {
			created, err := admin.CreateSubscription(ctx, &pb.Subscription{Name: b.sub(tc.id), Topic: b.topic("configs"), PushConfig: tc.in})
			if err != nil {
				t.Fatalf("create %s: %v", tc.id, err)
			}
			expect("create "+tc.id, tc.id, created, tc.want)
		}

		update := func(pc *pb.PushConfig) *pb.Subscription {
			t.Helper()
			s, err := admin.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
				Subscription: &pb.Subscription{Name: b.sub("pull"), PushConfig: pc}, UpdateMask: fieldMask("push_config")})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		want := defaultWrapped
		if b.fake {
			want = pushTo(endpoint) // pstest adds pubsub_wrapper at creation only
		}
		expect("update pull to push", "pull", update(pushTo(endpoint)), want)
		expect("update push to pull", "pull", update(&pb.PushConfig{}), &pb.PushConfig{})

		err := admin.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: b.sub("pull"), PushConfig: full})
		if b.fake {
			wantCode(t, "pstest's ModifyPushConfig", err, codes.Unimplemented)
		} else {
			if err != nil {
				t.Fatal(err)
			}
			expect("ModifyPushConfig", "pull", nil, full)
		}

		// pstest and Google's emulator take any endpoint; the sidecar only
		// those --push-allow allows (loopback by default).
		_, err = admin.CreateSubscription(ctx, &pb.Subscription{Name: b.sub("public"), Topic: b.topic("configs"),
			PushConfig: pushTo("https://example.com/push")})
		if b.fake || b.emulator {
			wantCode(t, b.name+"'s push to a public host", err, codes.OK)
		} else {
			wantCode(t, "push to a public host", err, codes.InvalidArgument)
		}

		// The service refuses Pull on a push subscription; pstest and
		// Google's emulator serve it.
		_, err = admin.Pull(ctx, &pb.PullRequest{Subscription: b.sub("push-default"), MaxMessages: 1, ReturnImmediately: true})
		if b.fake || b.emulator {
			wantCode(t, b.name+"'s Pull on a push subscription", err, codes.OK)
		} else {
			wantCode(t, "Pull on a push subscription", err, codes.FailedPrecondition)
		}
	})
}
