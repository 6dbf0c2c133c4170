// Package prometheus holds the Prometheus rules for the sidecar's metrics
// (jetorder-rules.yml) and their promtool unit tests
// (jetorder-rules.test.yml); its Go tests run promtool on them.
package prometheus

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jetorder/jetorder/internal/itest"
)

const (
	rulesFile = "jetorder-rules.yml"
	testsFile = "jetorder-rules.test.yml"
	docsFile  = "../../docs/OPERATING.md"
	docsURL   = "https://github.com/jetorder/jetorder/blob/main/docs/OPERATING.md#"
)

// promtool accepts the rules and their unit tests pass. Without promtool
// the test is skipped, unless JETORDER_REQUIRE_PROMETHEUS=1.
func TestPromtool(t *testing.T) {
	promtool := itest.PrometheusTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", testsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every alert has a unit test case where it fires and one where it does
// not, a section in the docs, and a runbook_url that links to it.
func TestEveryAlertTestedAndDocumented(t *testing.T) {
	rules, tests, docs := read(t, rulesFile), read(t, testsFile), read(t, docsFile)
	alerts := regexp.MustCompile(`(?m)^\s+- alert: (\w+)$`).FindAllStringSubmatch(rules, -1)
	if len(alerts) == 0 {
		t.Fatalf("no alerts in %s", rulesFile)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+alertname: (\w+)\n\s+exp_alerts:( \[\])?$`).FindAllStringSubmatch(tests, -1) {
		if m[2] == "" {
			firing[m[1]] = true
		} else {
			quiet[m[1]] = true
		}
	}
	for _, m := range alerts {
		name := m[1]
		if !firing[name] || !quiet[name] {
			t.Errorf("%s: %s has a case where it fires: %v, where it does not: %v; want both", testsFile, name, firing[name], quiet[name])
		}
		if !regexp.MustCompile(`(?m)^### ` + name + `$`).MatchString(docs) {
			t.Errorf("%s has no section ### %s", docsFile, name)
		}
		if url := `runbook_url: "` + docsURL + strings.ToLower(name) + `"`; strings.Count(rules, url) != 1 {
			t.Errorf("%s: %s does not link to its section once (%s)", rulesFile, name, url)
		}
	}
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
