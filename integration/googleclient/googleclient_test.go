// Package googleclient runs Google's own clients against a sidecar as
// their users run them: the integration tests of its Go Pub/Sub clients
// (integration_test.go of cloud.google.com/go/pubsub/v2 and of the v1
// client, cloud.google.com/go/pubsub) through PUBSUB_EMULATOR_HOST, and
// the gcloud CLI's pubsub commands (gcloud_test.go). A package of its own,
// so that it runs beside the integration package.
package googleclient

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// A client module of Google's whose integration_test.go runs here.
type clientModule struct {
	path    string // module path
	version string // "": the one this module requires
	// notOnTheSidecar are the tests that cannot pass without Google, and
	// what they get instead.
	notOnTheSidecar map[string]string
	// mustPass are tests that pass only because of a feature the sidecar
	// has beyond Google's emulator: each must run, and pass.
	mustPass []string
}

var clientModules = []clientModule{
	{path: "cloud.google.com/go/pubsub/v2", notOnTheSidecar: map[string]string{
		// It subscribes to Google's public topic
		// projects/pubsub-public-data/topics/taxirides-realtime: NOT_FOUND.
		"TestIntegration_PublicTopic": "fail",
		// It needs Google credentials to detect the project from (and
		// skips itself: "doesn't pass locally").
		"TestIntegration_DetectProjectID": "skip",
	}},
	// The v1 client, which the v2 module still requires; the newest.
	{path: "cloud.google.com/go/pubsub", version: "v1.52.0", notOnTheSidecar: map[string]string{
		"TestIntegration_PublicTopic":     "fail", // as in v2
		"TestIntegration_DetectProjectID": "skip", // as in v2
		// Google credentials: a Cloud KMS key; the service account to
		// push with OIDC tokens as; the project's organization policy
		// (it skips itself without them).
		"TestIntegration_CreateTopic_KMS":                   "fail",
		"TestIntegration_UpdateSubscription":                "fail",
		"TestIntegration_MessageStoragePolicy_ProjectLevel": "skip",
		// It wants an RPC to a made-up endpoint to fail; with
		// PUBSUB_EMULATOR_HOST set, Google's client dials the emulator
		// host whatever endpoint it is given.
		"TestIntegration_BadEndpoint": "fail",
	}, mustPass: []string{
		// It sets and reads the IAM policies of a topic and a subscription
		// (with a domain:google.com member), which the sidecar keeps
		// without access control too, and tests a permission, which it
		// then grants (Google's emulator has no IAMPolicy service).
		"TestIntegration_Admin",
	}},
}

// clientPatch makes Google's integration tests use PUBSUB_EMULATOR_HOST:
// integrationTestClient (and the v1 integrationTestSchemaClient) want
// Google credentials (a service account key in GCLOUD_TESTS_GOLANG_KEY),
// and some tests name a regional endpoint of the service, which the
// emulator host must override.
var clientPatch = [2]string{
	`	ts := testutil.TokenSource(ctx, ScopePubSub, ScopeCloudPlatform)
	if ts == nil {
		t.Skip("Integration tests skipped. See CONTRIBUTING.md for details")
	}
	opts = append(withGRPCHeadersAssertion(t, option.WithTokenSource(ts)), opts...)`,
	`	opts = append(withGRPCHeadersAssertion(t, opts...), emulatorOptions()...)`,
}

// emulatorOptions is a file added to Google's package for clientPatch:
// the options the client gives itself for PUBSUB_EMULATOR_HOST, which
// the v1 schema client does not.
const emulatorOptions = `package pubsub

import (
	"os"

	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func emulatorOptions() []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(os.Getenv("PUBSUB_EMULATOR_HOST")),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}
}
`

// Every test of Google's integration_test.go passes against a sidecar
// with pipelined ordering (the service's: a test sends 1000 messages on
// one key), except those notOnTheSidecar says.
func TestGoogleClientIntegrationTests(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on Google's clients: not in -short")
	}
	t.Parallel()
	sc := itest.Start(t, sidecar.Config{Ordering: pubsubapi.PipelinedOrdering})
	for _, m := range clientModules {
		t.Run(path.Base(m.path), func(t *testing.T) { runClientTests(t, sc, m) })
	}
}

func runClientTests(t *testing.T, sc *itest.Sidecar, m clientModule) {
	var src string
	if m.version == "" {
		src = goCmd(t, "list", "-m", "-f", "{{.Dir}}", m.path)
	} else {
		var mod struct{ Dir, Error string }
		if err := json.Unmarshal([]byte(goCmd(t, "mod", "download", "-json", m.path+"@"+m.version)), &mod); err != nil || mod.Dir == "" {
			t.Fatalf("go mod download %s@%s: %v %s", m.path, m.version, err, mod.Error)
		}
		src = mod.Dir
	}
	dir := t.TempDir()
	copyModule(t, src, dir)
	file := filepath.Join(dir, "integration_test.go")
	code, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(code, []byte(clientPatch[0])) {
		t.Fatalf("%s's integrationTestClient changed: update clientPatch", m.path)
	}
	code = bytes.ReplaceAll(code, []byte(clientPatch[0]), []byte(clientPatch[1]))
	if err := os.WriteFile(file, code, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "jetorder_emulator_test.go"), []byte(emulatorOptions), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("go", "test", "-count=1", "-json", "-run", "^TestIntegration_", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PUBSUB_EMULATOR_HOST="+sc.GRPC, "GCLOUD_TESTS_GOLANG_PROJECT_ID="+itest.Project, "GOFLAGS=-mod=mod")
	out, _ := cmd.Output() // failing tests fail the command: the results say which
	results, logs := testResults(out)
	if len(results) == 0 {
		t.Fatalf("go test of Google's integration tests reported no test:\n%s", out)
	}
	for _, name := range slices.Sorted(maps.Keys(results)) {
		want := "pass"
		if w, ok := m.notOnTheSidecar[name]; ok {
			want = w
		}
		if results[name] != want {
			t.Errorf("%s: %s, want %s\n%s", name, results[name], want, logs[name])
		}
	}
	for name := range m.notOnTheSidecar {
		if _, ok := results[name]; !ok {
			t.Errorf("%s did not run: update notOnTheSidecar", name)
		}
	}
	for _, name := range m.mustPass {
		if _, ok := results[name]; !ok {
			t.Errorf("%s did not run: update mustPass", name)
		}
	}
	t.Logf("Google's %s integration tests: %v", m.path, results)
}

// testResults reads go test -json output: the result of each top-level
// test, and its output.
func testResults(out []byte) (results, logs map[string]string) {
	results, logs = map[string]string{}, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" || strings.Contains(ev.Test, "/") {
			continue
		}
		switch ev.Action {
		case "pass", "fail", "skip":
			results[ev.Test] = ev.Action
		case "output":
			logs[ev.Test] += ev.Output
		}
	}
	return results, logs
}

func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// copyModule copies the module at src (read-only in the module cache) to
// dst, writable.
func copyModule(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}
