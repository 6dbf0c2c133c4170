package main

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// commit is the commit the binary was built from, when the build sets it
// (-ldflags "-X main.commit=..."): make build and the Dockerfile do, for
// the builds where Go records none (below).
var commit string

// version is what --version prints: the module version, the commit, the
// embedded nats-server's version and the Go toolchain, one per line.
// linked is the commit the build set, if any.
//
// The Go toolchain records the module version, and the commit when it
// builds in a git checkout. go install ...@v1.2.3 gives the tag and no
// commit (a module download has no repository), go install ...@latest
// between tags a pseudo-version, which ends with the commit's prefix; go
// build in a clone gives a version made from the commit (+dirty with
// uncommitted changes) and the commit. go run, go test, a build with
// -buildvcs=false and, in Go 1.26, a build in a git worktree (its .git is
// a file) give "(devel)" and no commit: there, the linked one is used.
func version(bi *debug.BuildInfo, linked string) string {
	mod, rev := "(unknown)", ""
	goVersion := runtime.Version()
	if bi != nil {
		mod, goVersion = bi.Main.Version, bi.GoVersion
		if mod == "" {
			mod = "(devel)"
		}
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" && modified {
			rev += " (modified)"
		}
	}
	switch {
	case rev != "":
	case linked != "":
		rev = linked
	case pseudoVersion.MatchString(mod):
		rev = pseudoVersion.FindStringSubmatch(mod)[1] + " (from the version)"
	default:
		rev = "unknown"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "jetorder sidecar %s\n", mod)
	fmt.Fprintf(&b, "commit %s\n", rev)
	fmt.Fprintf(&b, "nats-server v%s\n", server.VERSION)
	fmt.Fprintf(&b, "%s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}

// pseudoVersion matches a Go pseudo-version (v0.0.0-20261125153000-fea373c2d2e6,
// v1.2.4-0.20261125153000-fea373c2d2e6) and captures its commit prefix.
var pseudoVersion = regexp.MustCompile(`[-.]\d{14}-([0-9a-f]{12})(\+incompatible)?$`)
