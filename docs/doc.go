// Package docs holds jetorder's reference pages: README.md at the root of
// the repository and the pages of this directory. It has no code; its
// tests keep the pages usable:
//
//   - README.md stays short enough to read in a few minutes;
//   - every relative link of README.md and docs/*.md names a file that
//     exists and, with a #fragment, a heading of that page;
//   - the reference pages say what holds, not when it was seen: a date
//     belongs in EVIDENCE.md (the dated runs and investigations), or in a
//     heading of BENCHMARKS.md that dates the figures under it.
//
// The flag reference of RUNNING.md is checked against the sidecar's flag
// parser in cmd/sidecar (docs_test.go there).
package docs
