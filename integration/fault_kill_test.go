package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The sidecar binary, killed with SIGKILL while it delivers and restarted
// on the same data dir and ports: Google's Go client reconnects by itself,
// every message is acked in the end, and per key the first deliveries stay
// in publish order. Acks the dead process had not passed on are lost, so a
// key may start again from a message acked before (counted as a rewind);
// from there it must go on in order. Messages published after the restart
// are delivered too.
func TestFaultSidecarSIGKILL(t *testing.T) {
	bin := killBuildSidecar(t)
	dir := t.TempDir()
	a := killStart(t, bin, dir, "127.0.0.1:0", "127.0.0.1:0")

	c := itest.GoClient(t, a.grpc)
	mustCreateTopic(t, c, "killed")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("killed-sub"), Topic: topicPath("killed"), EnableMessageOrdering: true, AckDeadlineSeconds: 10})

	chk := ordercheck.New()
	const keys, perBatch = 16, 30
	pub := c.Publisher("killed")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	publishBatch := func(from int) {
		t.Helper()
		var results []*pubsub.PublishResult
		for i := from; i < from+perBatch; i++ {
			for k := 0; k <= keys; k++ {
				key := fmt.Sprintf("device-%d", k)
				if k == keys {
					key = ""
				}
				results = append(results, pub.Publish(context.Background(), &pubsub.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
				chk.Published(key, i)
			}
		}
		for _, r := range results {
			if _, err := r.Get(context.Background()); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	publishBatch(0)

	var lastDelivery atomic.Int64 // unix nanos
	stopReceive := receiveGo(t, c.Subscriber("killed-sub"), func(_ context.Context, m *pubsub.Message) {
		lastDelivery.Store(time.Now().UnixNano())
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		chk.Delivered("killed-sub", key, idx)
		chk.Acked("killed-sub", key, idx)
		m.Ack()
	})
	total := (keys + 1) * perBatch
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Stats("killed-sub").Acks >= total/3 },
		"a third of the messages not acked before the kill: %+v", func() ordercheck.Stats { return chk.Stats("killed-sub") })

	chk.AcksMayBeLost()
	before := chk.Stats("killed-sub")
	killedAt := time.Now()
	a.kill()
	b := killStart(t, bin, dir, a.grpc, a.http)
	restartedIn := time.Since(killedAt)
	testutil.Eventually(t, 60*time.Second, func() bool { return lastDelivery.Load() > b.readyAt.UnixNano() },
		"nothing delivered after the restart")
	stall := time.Unix(0, lastDelivery.Load()).Sub(killedAt)

	publishBatch(perBatch)
	testutil.Eventually(t, 90*time.Second, func() bool { return chk.Complete("killed-sub") },
		"not acked after the restart: %s", func() string { return chk.Missing("killed-sub") })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	st := chk.Stats("killed-sub")
	t.Logf("SIGKILL after %d of %d acks; restart took %v; first delivery %v after the kill; "+
		"%d messages (%d keys + unkeyed), %d deliveries, %d redeliveries, %d keys went back to a message acked before",
		before.Acks, total, restartedIn.Round(time.Millisecond), stall.Round(time.Millisecond),
		2*total, keys, st.Deliveries, st.Redeliveries, st.Rewinds)
	stopReceive() // while the sidecar still answers the client's last acks
	b.terminate()
	if testing.Verbose() && os.Getenv("JETORDER_TEST_LOG") != "" {
		t.Logf("restarted sidecar's log:\n%s", b.log.String())
	}
}

// killBuildSidecar builds cmd/sidecar with the race detector into a temp
// dir (the test's own packages are built so already, so only linking is
// new work).
func killBuildSidecar(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sidecar")
	if out, err := exec.Command(goBin, "build", "-race", "-o", bin, "../cmd/sidecar").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sidecar: %v\n%s", err, out)
	}
	return bin
}

// killProc is the sidecar binary running as a child process.
type killProc struct {
	t          *testing.T
	cmd        *exec.Cmd
	grpc, http string
	readyAt    time.Time
	exited     chan struct{}
	log        *testutil.LogBuffer
}

var killListening = regexp.MustCompile(`msg="jetorder sidecar listening" grpc=(\S+) http=(\S+)`)

func killStart(t *testing.T, bin, dataDir, grpcAddr, httpAddr string, extra ...string) *killProc {
	t.Helper()
	args := append([]string{"--data-dir", dataDir, "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--shutdown-timeout", "2s"}, extra...)
	if itest.Delivery != "" {
		args = append(args, "--delivery", string(itest.Delivery))
	}
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &killProc{t: t, cmd: cmd, exited: make(chan struct{}), log: &testutil.LogBuffer{}}
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			_, _ = p.log.Write([]byte(sc.Text() + "\n"))
			if m := killListening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if strings.Contains(p.log.String(), "DATA RACE") {
			t.Errorf("the sidecar process reported a data race:\n%s", p.log.String())
		}
	})
	select {
	case m := <-found:
		p.grpc, p.http, p.readyAt = m[1], m[2], time.Now()
	case <-p.exited:
		t.Fatalf("sidecar exited before it was ready:\n%s", p.log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("sidecar not ready within 60s:\n%s", p.log.String())
	}
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *killProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// terminate sends SIGTERM and expects a clean exit within the shutdown
// timeout and a margin.
func (p *killProc) terminate() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			p.t.Errorf("sidecar exited with %d after SIGTERM:\n%s", code, p.log.String())
		}
	case <-time.After(30 * time.Second):
		p.t.Errorf("sidecar still running 30s after SIGTERM")
	}
}
