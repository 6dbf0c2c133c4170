package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// CPU profiles of one delivery (b.deliveryProfile), split by who spent the
// time, so a figure that misses its target is printed beside where its CPU
// went: the server's share and jetorder's.

// cpuComponents are the parts of the bench process a CPU sample can be
// charged to, by function name prefix; the first match wins.
var cpuComponents = []struct{ name, prefix string }{
	{"nats-server", "github.com/nats-io/nats-server/"},
	{"nats.go", "github.com/nats-io/nats.go"},
	{"jetorder adapter", "github.com/jetorder/jetorder/adapter."},
	{"jetorder adapter", "github.com/jetorder/jetorder/keyrouter."},
	{"jetorder adapter", "github.com/jetorder/jetorder/internal/filter."},
	{"jetorder adapter", "github.com/jetorder/jetorder/internal/rsb."},
	{"jetorder sidecar", "github.com/jetorder/jetorder/internal/"}, // pubsubapi, broker, ...
	// The generated Pub/Sub types serve the sidecar and the client alike.
	{"gRPC, HTTP/2, protobuf", "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb."},
	{"Google's Go client", "cloud.google.com/go/"},
	{"gRPC, HTTP/2, protobuf", "google.golang.org/grpc"},
	{"gRPC, HTTP/2, protobuf", "google.golang.org/protobuf"},
	{"gRPC, HTTP/2, protobuf", "golang.org/x/net/"},
	{"bench handlers", "main."},
}

// cpuShare is one component's CPU time in a profile.
type cpuShare struct {
	name string
	cpu  time.Duration
}

// cpuShares reads the CPU profile at path and charges each sample to the
// innermost frame of a known component: the Go runtime's and the standard
// library's frames go to the code they ran for (an allocation to whoever
// allocated, a syscall to whoever wrote), the garbage collector's
// background workers (marking, sweeping, scavenging) to "Go GC". It returns the shares, largest first, the
// CPU time sampled and the wall time profiled.
func cpuShares(path string) (shares []cpuShare, total, wall time.Duration, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, 0, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, 0, 0, err
	}
	value := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" })
	if value < 0 {
		return nil, 0, 0, fmt.Errorf("%s: not a CPU profile", path)
	}
	by := map[string]time.Duration{}
	for _, s := range p.Sample {
		d := time.Duration(s.Value[value])
		total += d
		by[chargeSample(s)] += d
	}
	for name, cpu := range by {
		shares = append(shares, cpuShare{name, cpu})
	}
	slices.SortFunc(shares, func(a, b cpuShare) int { return int(b.cpu - a.cpu) })
	return shares, total, time.Duration(p.DurationNanos), nil
}

func chargeSample(s *profile.Sample) string {
	var funcs []string // innermost first
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function != nil {
				funcs = append(funcs, line.Function.Name)
			}
		}
	}
	for _, fn := range funcs {
		switch {
		case strings.HasPrefix(fn, "runtime.gcBgMarkWorker"), fn == "runtime.bgsweep", fn == "runtime.bgscavenge":
			return "Go GC"
		}
	}
	for _, fn := range funcs {
		for _, c := range cpuComponents {
			if strings.HasPrefix(fn, c.prefix) {
				return c.name
			}
		}
	}
	return "other (runtime, syscalls)"
}

// describeCPU is one line on the profile at path: CPU sampled over the
// wall time, and each component's share.
func describeCPU(path string) string {
	shares, total, wall, err := cpuShares(path)
	if err != nil {
		return "CPU profile: " + err.Error()
	}
	if total == 0 {
		return "CPU profile " + path + ": no samples"
	}
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = fmt.Sprintf("%s %.0f%%", s.name, 100*s.cpu.Seconds()/total.Seconds())
	}
	return fmt.Sprintf("CPU profile %s: %.2f s of CPU in %.2f s on %d cores: %s", path,
		total.Seconds(), wall.Seconds(), runtime.GOMAXPROCS(0), strings.Join(parts, ", "))
}
