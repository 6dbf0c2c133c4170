package itest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// StartNATSServers runs n nats-server processes of bin (BuildNATSServer)
// with JetStream on file storage in t.TempDir(), routed into one cluster
// when n > 1, and waits until their JetStream answers. It returns their
// client URLs, comma-separated, as --nats-url takes them. The servers are
// killed when the test ends.
func StartNATSServers(t testing.TB, bin string, n int) string {
	t.Helper()
	clients, routes, listen := make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		clients[i], listen[i] = "nats://"+FreeAddr(t), FreeAddr(t)
		routes[i] = fmt.Sprintf("%q", "nats-route://"+listen[i])
	}
	for i := range n {
		conf := fmt.Sprintf("server_name: n%d\nlisten: %q\njetstream { store_dir: %q }\n",
			i, strings.TrimPrefix(clients[i], "nats://"), filepath.Join(t.TempDir(), "js"))
		if n > 1 {
			conf += fmt.Sprintf("cluster { name: itest, listen: %q, routes: [%s] }\n", listen[i], strings.Join(routes, ", "))
		}
		file := filepath.Join(t.TempDir(), fmt.Sprintf("n%d.conf", i))
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		StartProcess(t, bin, []string{"-c", file}, nil, nil)
	}
	urls := strings.Join(clients, ",")
	WaitClusterJetStream(t, urls)
	return urls
}
