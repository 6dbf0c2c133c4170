package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

// runningDoc is the page whose "Flags" section is the flag reference.
const runningDoc = "../../docs/RUNNING.md"

// helpFlag is one flag as -h prints it: its name and, when it has one,
// its default.
type helpFlag struct {
	name, def  string
	hasDefault bool
}

// helpFlags returns the flags -h prints, from the real parser.
func helpFlags(t *testing.T) map[string]helpFlag {
	t.Helper()
	var help bytes.Buffer
	if _, err := parseConfig([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parseConfig(-h): %v, want flag.ErrHelp", err)
	}
	// PrintDefaults: "  -name type" then an indented usage line that ends
	// in (default "x") when the default is not the zero value.
	nameRE := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	defRE := regexp.MustCompile(`\(default "(.*)"\)$`)
	flags := map[string]helpFlag{}
	var cur string
	for line := range strings.SplitSeq(help.String(), "\n") {
		if m := nameRE.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = helpFlag{name: cur}
			continue
		}
		if m := defRE.FindStringSubmatch(line); m != nil && cur != "" {
			flags[cur] = helpFlag{name: cur, def: m[1], hasDefault: true}
		}
	}
	if len(flags) < 10 {
		t.Fatalf("found %d flags in the -h output:\n%s", len(flags), help.String())
	}
	return flags
}

// flagRow is a row of the flag reference: the flags of its first cell, and
// its environment and default cells.
type flagRow struct {
	line     int
	flags    []string
	env, def string
}

// flagReference reads the table of the "## Flags" section of RUNNING.md.
func flagReference(t *testing.T) []flagRow {
	t.Helper()
	b, err := os.ReadFile(runningDoc)
	if err != nil {
		t.Fatal(err)
	}
	flagRE := regexp.MustCompile("`--([a-z0-9-]+)`")
	var rows []flagRow
	in := false
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Flags"
			continue
		case !in || !strings.HasPrefix(line, "|"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 || strings.TrimSpace(cells[0]) == "flag" || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
			continue
		}
		r := flagRow{line: i + 1, env: strings.TrimSpace(cells[1]), def: strings.TrimSpace(cells[2])}
		for _, m := range flagRE.FindAllStringSubmatch(cells[0], -1) {
			r.flags = append(r.flags, m[1])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no table in its \"## Flags\" section", runningDoc)
	}
	return rows
}

// TestFlagReference: every flag -h prints appears exactly once in the flag
// reference of docs/RUNNING.md, the reference names no flag the parser
// lacks, each row names the environment variable that sets its flag (set
// here, it must become the flag's default), and where the parser prints a
// default the row gives the same one.
func TestFlagReference(t *testing.T) {
	// The defaults -h prints come from the environment: none of it here.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "JETORDER_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
	help := helpFlags(t)
	rows := flagReference(t)

	seen := map[string]int{}
	for _, r := range rows {
		if len(r.flags) != 1 {
			t.Errorf("%s:%d: a row of the flag reference names %d flags (%q), want one", runningDoc, r.line, len(r.flags), r.flags)
			continue
		}
		name := r.flags[0]
		seen[name]++
		h, ok := help[name]
		if !ok {
			t.Errorf("%s:%d: --%s is not a flag of the sidecar", runningDoc, r.line, name)
			continue
		}
		if h.hasDefault && !strings.Contains(r.def, "`"+h.def+"`") {
			t.Errorf("%s:%d: --%s: default cell %q, want it to show `%s`", runningDoc, r.line, name, r.def, h.def)
		}
		want := "JETORDER_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if r.env == "none" {
			// A flag without a variable: setting the variable must change nothing.
			t.Setenv(want, "docs-probe")
			if got := helpFlags(t)[name]; got.def == "docs-probe" {
				t.Errorf("%s:%d: --%s: environment cell says none, but %s sets it", runningDoc, r.line, name, want)
			}
			os.Unsetenv(want)
			continue
		}
		if r.env != "`"+want+"`" {
			t.Errorf("%s:%d: --%s: environment cell %q, want `%s`", runningDoc, r.line, name, r.env, want)
			continue
		}
		t.Setenv(want, "docs-probe")
		if got := helpFlags(t)[name]; got.def != "docs-probe" {
			t.Errorf("%s:%d: --%s: %s=docs-probe does not set it (default %q)", runningDoc, r.line, name, want, got.def)
		}
		os.Unsetenv(want)
	}
	for name := range help {
		if seen[name] != 1 {
			t.Errorf("%s: --%s appears %d times in the flag reference (section \"## Flags\"), want once", runningDoc, name, seen[name])
		}
	}
}
