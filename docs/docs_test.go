package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds README.md: what jetorder is, how to start, what it
// guarantees, and where to read on. The rest is in docs/.
const readmeMaxLines = 250

// evidencePage holds the dated runs and investigations; benchmarksPage may
// date its figures in its headings.
const (
	evidencePage   = "EVIDENCE.md"
	benchmarksPage = "BENCHMARKS.md"
)

// page is a markdown file, as lines, with what the checks need.
type page struct {
	path  string   // relative to this directory
	lines []string // the file's lines
	prose []bool   // per line: outside a fenced code block
}

// pages returns README.md and every docs/*.md.
func pages(t *testing.T) []page {
	t.Helper()
	paths, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append([]string{filepath.Join("..", "README.md")}, paths...)
	var out []page
	for _, p := range paths {
		out = append(out, readPage(t, p))
	}
	if len(out) < 3 {
		t.Fatalf("found only %v", paths)
	}
	return out
}

func readPage(t *testing.T, path string) page {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := page{path: path, lines: strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")}
	fence := ""
	for _, line := range p.lines {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			p.prose = append(p.prose, false)
		case fence != "":
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			p.prose = append(p.prose, false)
		default:
			p.prose = append(p.prose, true)
		}
	}
	return p
}

var (
	headingRE    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeSpanRE   = regexp.MustCompile("`[^`]*`")
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	dateRE       = regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	linkTargetRE = regexp.MustCompile(`\]\([^)]*\)`)
	// datedHeadingRE is how a heading of BENCHMARKS.md dates what is under it.
	datedHeadingRE = regexp.MustCompile(`(?i)\b(figures|profile) of 20\d\d-\d\d-\d\d$`)
)

// undatedBenchmarkSections are the sections of BENCHMARKS.md that measure
// nothing themselves: how to run the bench, and the summary of the others.
var undatedBenchmarkSections = map[string]bool{"Running them": true, "Against the targets": true}

// anchor is GitHub's anchor of a heading's text: lower case, spaces to
// '-', every other character but letters, digits, '-' and '_' dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a page's headings, a repeated heading's
// with GitHub's -1, -2, ... suffixes.
func (p page) anchors() map[string]bool {
	out := map[string]bool{}
	count := map[string]int{}
	for i, line := range p.lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil || !p.prose[i] {
			continue
		}
		a := anchor(m[2])
		if n := count[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		count[a]++
	}
	return out
}

func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Fault tests (`integration/`, in `make test`)":                    "fault-tests-integration-in-make-test",
		"Differences from the service, Google's emulator and pstest":      "differences-from-the-service-googles-emulator-and-pstest",
		"Key streams: partitioned delivery without filtered reads (1.2x)": "key-streams-partitioned-delivery-without-filtered-reads-12x",
		"`make bench`, three runs":                                        "make-bench-three-runs",
		"A_b c-d":                                                         "a_b-c-d",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestReadmeLength: README.md is at most readmeMaxLines lines.
func TestReadmeLength(t *testing.T) {
	p := readPage(t, filepath.Join("..", "README.md"))
	if n := len(p.lines); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, want at most %d: move detail to a page of docs/ and link it", n, readmeMaxLines)
	}
}

// TestRelativeLinks: every relative link outside code names an existing
// file, and a #fragment names a heading of the markdown page it points to.
func TestRelativeLinks(t *testing.T) {
	all := pages(t)
	anchorsOf := map[string]map[string]bool{}
	for _, p := range all {
		anchorsOf[filepath.Clean(p.path)] = p.anchors()
	}
	links := 0
	for _, p := range all {
		for i, line := range p.lines {
			if !p.prose[i] {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, frag, _ := strings.Cut(target, "#")
				where := fmt.Sprintf("%s:%d: link %q", p.path, i+1, target)
				dest := filepath.Clean(p.path)
				if file != "" {
					dest = filepath.Clean(filepath.Join(filepath.Dir(p.path), file))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s: %v", where, err)
						continue
					}
				}
				if frag == "" {
					continue
				}
				anchors, ok := anchorsOf[dest]
				if !ok {
					if !strings.HasSuffix(dest, ".md") {
						t.Errorf("%s: a fragment of a file that is not a markdown page", where)
						continue
					}
					anchors = readPage(t, dest).anchors()
				}
				if !anchors[frag] {
					t.Errorf("%s: %s has no heading with the anchor #%s", where, dest, frag)
				}
			}
		}
	}
	if links < 50 {
		t.Errorf("found only %d relative links: is the link pattern still right?", links)
	}
}

// TestNoDatedRunsInReferencePages: a reference page says what holds and
// how to reproduce it; the date a figure or a failure was seen, with the
// run's log, goes to EVIDENCE.md, which the page links. So no page but
// EVIDENCE.md carries a date (YYYY-MM-DD), except:
//   - in a link's target (an anchor of EVIDENCE.md may hold one);
//   - as part of an RFC 3339 timestamp in an example (2026-11-25T16:00:11Z);
//   - in a heading of BENCHMARKS.md that ends "figures of DATE" or
//     "profile of DATE", dating what is under it.
func TestNoDatedRunsInReferencePages(t *testing.T) {
	for _, p := range pages(t) {
		base := filepath.Base(p.path)
		if base == evidencePage {
			continue
		}
		for i, line := range p.lines {
			if base == benchmarksPage && p.prose[i] && headingRE.MatchString(line) && datedHeadingRE.MatchString(line) {
				continue
			}
			if d := dateRE.FindString(linkTargetRE.ReplaceAllString(line, "]()")); d != "" {
				t.Errorf("%s:%d: dated %s: a reference page says what holds; move the run to %s and link it", p.path, i+1, d, evidencePage)
			}
		}
	}
}

// TestBenchmarkFiguresDated: each measurement of BENCHMARKS.md (a "## "
// section) says when its figures were measured, in a heading under it.
func TestBenchmarkFiguresDated(t *testing.T) {
	p := readPage(t, benchmarksPage)
	section, dated, sections := "", false, 0
	check := func() {
		if section != "" && !undatedBenchmarkSections[section] && !dated {
			t.Errorf("%s: section %q has no heading that dates its figures (\"### Figures of YYYY-MM-DD\")", benchmarksPage, section)
		}
	}
	for i, line := range p.lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil || !p.prose[i] {
			continue
		}
		if len(m[1]) == 2 {
			check()
			section, dated = m[2], false
			sections++
			continue
		}
		if datedHeadingRE.MatchString(m[2]) {
			dated = true
		}
	}
	check()
	if sections < 5 {
		t.Errorf("%s: found %d sections", benchmarksPage, sections)
	}
}
