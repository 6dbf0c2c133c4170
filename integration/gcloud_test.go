package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// gcloud runs gcloud pubsub args against sc (itest.Sidecar.Gcloud) and
// returns what it printed on stdout, then stderr.
func gcloud(t *testing.T, sc *itest.Sidecar, fail bool, args ...string) string {
	t.Helper()
	stdout, stderr := sc.Gcloud(fail, args...)
	return stdout + stderr
}

// gcloudValue is what a command with --format=value(...) printed on
// stdout, trimmed.
func gcloudValue(t *testing.T, sc *itest.Sidecar, args ...string) string {
	t.Helper()
	stdout, _ := sc.Gcloud(false, args...)
	return strings.TrimSpace(stdout)
}

// gcloud's pubsub schemas commands through the sidecar's REST routes
// (docs/HTTP.md). Skipped where gcloud is not installed, and in the
// per-key pass of make test: no subscription is involved.
func TestGcloudSchemas(t *testing.T) {
	if _, err := exec.LookPath("gcloud"); err != nil {
		t.Skip("gcloud is not installed")
	}
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("no subscription: the default pass covers it")
	}
	sc := itest.Start(t, sidecar.Config{})
	dir := t.TempDir()
	v1, v2 := filepath.Join(dir, "v1.avsc"), filepath.Join(dir, "v2.avsc")
	for file, def := range map[string]string{
		v1: `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}`,
		v2: `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}, {"name": "note", "type": "string", "default": ""}]}`,
	} {
		if err := os.WriteFile(file, []byte(def), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, "create", gcloud(t, sc, false, "schemas", "create", "orders", "--type=avro", "--definition-file="+v1), "Created schema [orders]")
	first := gcloudValue(t, sc, "schemas", "describe", "orders", "--format=value(revisionId)")
	if first == "" {
		t.Fatal("describe: no revision id")
	}
	if got := gcloudValue(t, sc, "schemas", "list", "--format=value(name.basename())"); got != "orders" {
		t.Errorf("list: %q, want orders", got)
	}
	second := gcloudValue(t, sc, "schemas", "commit", "orders", "--type=avro", "--definition-file="+v2, "--format=value(revisionId)")
	revs := gcloud(t, sc, false, "schemas", "list-revisions", "orders", "--format=value(revisionId)")
	if !strings.Contains(revs, first) || !strings.Contains(revs, second) {
		t.Errorf("list-revisions %q, want %s and %s", revs, first, second)
	}
	mustContain(t, "validate-schema", gcloud(t, sc, false, "schemas", "validate-schema", "--type=avro", "--definition-file="+v1), "Schema is valid")
	mustContain(t, "validate-message", gcloud(t, sc, false, "schemas", "validate-message", "--schema-name=orders", "--message-encoding=json", `--message={"id": 1}`), "Message is valid")
	mustContain(t, "an invalid message", gcloud(t, sc, true, "schemas", "validate-message", "--schema-name=orders", "--message-encoding=json", `--message={"id": "x"}`), "INVALID_ARGUMENT")
	gcloud(t, sc, false, "schemas", "rollback", "orders", "--revision-id="+first)
	gcloud(t, sc, false, "schemas", "delete-revision", "orders@"+second, "--quiet")
	if revs := gcloud(t, sc, false, "schemas", "list-revisions", "orders", "--format=value(revisionId)"); strings.Contains(revs, second) {
		t.Errorf("list-revisions after delete-revision %q still has %s", revs, second)
	}
	gcloud(t, sc, false, "schemas", "delete", "orders", "--quiet")
	mustContain(t, "describe after delete", gcloud(t, sc, true, "schemas", "describe", "orders"), "NOT_FOUND")
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q, want it to contain %q", what, got, want)
	}
}
