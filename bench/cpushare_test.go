package main

import (
	"testing"

	"github.com/google/pprof/profile"
)

func TestChargeSample(t *testing.T) {
	for _, c := range []struct {
		stack []string // innermost first
		want  string
	}{
		{[]string{"runtime.mallocgc", "github.com/jetorder/jetorder/internal/pubsubapi.(*dispatcher).handle", "github.com/jetorder/jetorder/adapter.(*receiver).handle"}, "jetorder sidecar"},
		{[]string{"runtime.mapaccess1_faststr", "github.com/jetorder/jetorder/adapter.(*gates).ackMade", "main.(*bench).modeThroughput.func2"}, "jetorder adapter"},
		{[]string{"syscall.Syscall6", "github.com/nats-io/nats-server/v2/server.(*client).flushOutbound"}, "nats-server"},
		{[]string{"runtime.scanobject", "github.com/nats-io/nats.go.(*Conn).processMsg", "runtime.gcBgMarkWorker"}, "Go GC"},
		{[]string{"google.golang.org/protobuf/proto.Marshal", "cloud.google.com/go/pubsub/v2.(*Subscriber).Receive"}, "gRPC, HTTP/2, protobuf"},
		{[]string{"runtime.futex", "runtime.mcall"}, "other (runtime, syscalls)"},
		{[]string{"github.com/jetorder/jetorder/keyrouter.TokenOfSubject", "github.com/jetorder/jetorder/internal/pubsubapi.(*dispatcher).handle"}, "jetorder adapter"},
		{[]string{"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb.(*PubsubMessage).GetData", "github.com/jetorder/jetorder/internal/pubsubapi.messageProto"}, "gRPC, HTTP/2, protobuf"},
		{[]string{"runtime.sweepone", "runtime.bgsweep"}, "Go GC"},
	} {
		s := &profile.Sample{}
		for i, name := range c.stack {
			line := profile.Line{Function: &profile.Function{Name: name}}
			if i == 1 {
				// Inlined into the next frame: one location, innermost line first.
				loc := s.Location[len(s.Location)-1]
				loc.Line = append(loc.Line, line)
				continue
			}
			s.Location = append(s.Location, &profile.Location{Line: []profile.Line{line}})
		}
		if got := chargeSample(s); got != c.want {
			t.Errorf("stack %q charged to %q, want %q", c.stack, got, c.want)
		}
	}
}
