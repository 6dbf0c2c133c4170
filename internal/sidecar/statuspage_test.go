package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/chromedp/chromedp"
)

// chromium finds a Chromium for the browser test: $JETORDER_CHROMIUM, or
// one on PATH (.ci/chromium installs Debian's when none is there). Without
// one the test is skipped, unless JETORDER_REQUIRE_BROWSER=1 (CI), where
// it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("JETORDER_CHROMIUM"), "chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "headless-shell"} {
		if name == "" {
			continue
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	msg := "no Chromium found (looked for $JETORDER_CHROMIUM, chromium, chromium-browser, google-chrome, headless-shell): " +
		"run .ci/chromium as root to install Debian's chromium, or set JETORDER_CHROMIUM"
	if os.Getenv("JETORDER_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// The status page, in a real headless Chromium: it shows a subscription's
// backlog grow as messages are published and fall back to 0 as a client
// acks them, refreshing by itself, and loads nothing from anywhere but the
// sidecar.
func TestStatusPageInBrowser(t *testing.T) {
	exe := chromium(t)
	at := startSidecar(t)
	c := goClient(t, at.GRPC)
	createTopic(t, c, "shown")
	createSub(t, c, &pb.Subscription{Name: subPath("shown-sub"), Topic: topicPath("shown"), EnableMessageOrdering: true})

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The browser lives as long as the context of the first Run: bctx.
	// Chromium's start is bounded by the allocator (20 s to answer).
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	// eval evaluates a JavaScript expression in the page, within 10 s.
	eval := func(expr string) (string, error) {
		ctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		return chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	}

	base := "http://" + at.HTTP
	row := `tr[data-subscription="` + subPath("shown-sub") + `"]`
	// waitBacklog waits until the page's row of the subscription shows
	// backlog want, polling the page as it refreshes itself.
	waitBacklog := func(want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 40*time.Second)
		defer cancel()
		js := `(() => { const c = document.querySelector('` + row + ` td.backlog'); return c !== null && c.textContent === '` + want + `'; })()`
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			shown, _ := eval("document.body.innerText")
			t.Fatalf("the page never showed backlog %s: %v; it shows:\n%s", want, err, shown)
		}
	}

	nctx, cancelNav := context.WithTimeout(bctx, 60*time.Second)
	defer cancelNav()
	if err := chromedp.Do(nctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open the status page: %v", err)
	}
	waitBacklog("0")

	p := c.Publisher("shown")
	p.EnableMessageOrdering = true
	t.Cleanup(p.Stop)
	publish(t, p, 0, 5, 2)
	waitBacklog("5")

	// A client receives and acks them: the page goes back to 0.
	ctx, cancel := context.WithCancel(context.Background())
	var acked sync.WaitGroup
	acked.Add(5)
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber("shown-sub").Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			acked.Done()
		})
	}()
	waitBacklog("0")
	acked.Wait()
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Receive: %v", err)
	}

	if health, err := eval(`document.querySelector('#health [data-health="JetStream"] dd').textContent`); err != nil || health != "available" {
		t.Errorf("the page's JetStream health = %q, %v; want available", health, err)
	}
	// What the page loaded, its polls included: all of it from the sidecar.
	loaded, err := eval(`JSON.stringify(performance.getEntriesByType('resource').map((e) => e.name))`)
	if err != nil {
		t.Fatal(err)
	}
	var requests []string
	if err := json.Unmarshal([]byte(loaded), &requests); err != nil {
		t.Fatal(err)
	}
	polls := 0
	for _, r := range requests {
		u, err := url.Parse(r)
		if err != nil || u.Scheme+"://"+u.Host != base {
			t.Errorf("the page loaded %s, from outside the sidecar", r)
		}
		if u != nil && u.Path == "/v1/status" {
			polls++
		}
	}
	if polls < 3 {
		t.Errorf("the page asked /v1/status %d times, want it to keep polling: %v", polls, requests)
	}
}
