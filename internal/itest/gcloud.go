package itest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Gcloud runs `gcloud pubsub args...` (Google's CLI) against the sidecar's
// REST API, without credentials, in project Project, with a configuration
// of its own (none of the user's, none written), and returns what it
// printed on stdout and on stderr. The test fails unless gcloud fails
// exactly when fail says; it is skipped where gcloud is not installed.
func (s *Sidecar) Gcloud(fail bool, args ...string) (stdout, stderr string) {
	s.t.Helper()
	if _, err := exec.LookPath("gcloud"); err != nil {
		s.t.Skip("gcloud is not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "gcloud", append([]string{"pubsub"}, args...)...)
	cmd.Env = append(os.Environ(),
		"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB=http://"+s.HTTP+"/",
		"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true",
		"CLOUDSDK_CORE_PROJECT="+Project,
		"CLOUDSDK_CONFIG="+s.t.TempDir(),
		"CLOUDSDK_CORE_DISABLE_PROMPTS=1",
	)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if (err != nil) != fail {
		s.t.Fatalf("gcloud pubsub %s: %v (want failure: %v)\n%s%s", strings.Join(args, " "), err, fail, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}
