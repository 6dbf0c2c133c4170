package ordercheck

import (
	"strings"
	"testing"
)

// The checker must catch each kind of violation, or the tests built on it
// could never fail.
func TestCheckerCatchesViolations(t *testing.T) {
	tests := []checkerCase{
		{"in order", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Acked("s", "k", 0)
			c.Delivered("s", "k", 1)
			c.Acked("s", "k", 1)
		}, ""},
		{"redelivery after nack", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Released("s", "k", 0)
			c.Delivered("s", "k", 0)
			c.Acked("s", "k", 0)
		}, ""},
		{"skips ahead", func(c *Checker) {
			c.Delivered("s", "k", 1)
		}, "delivered before message 0 was acked"},
		{"while predecessor unacked", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Delivered("s", "k", 1)
		}, "while message 0 is unacked"},
		{"newer before redelivery", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Released("s", "k", 0)
			c.Delivered("s", "k", 1)
		}, "delivered before message 0 was acked"},
		{"acked message comes back", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Acked("s", "k", 0)
			c.Delivered("s", "k", 0)
		}, "again after it was acked"},
		{"unkeyed twice in handlers", func(c *Checker) {
			c.Delivered("s", "", 3)
			c.Delivered("s", "", 3)
		}, "already in a handler"},
		{"keys are independent", func(c *Checker) {
			c.Delivered("s", "a", 0)
			c.Delivered("s", "b", 0)
			c.Delivered("t", "a", 0)
		}, ""},
	}
	runCases(t, New, tests)
}

func TestCheckerMissingAndStats(t *testing.T) {
	c := New()
	for i := range 3 {
		c.Published("k", i)
	}
	c.Published("", 0)
	c.Delivered("s", "k", 0)
	c.Acked("s", "k", 0)
	c.Delivered("s", "k", 1)
	c.Released("s", "k", 1)
	c.Delivered("s", "k", 1)
	c.Acked("s", "k", 1)
	if c.Complete("s") {
		t.Fatal("complete with message 2 and the unkeyed one missing")
	}
	if m := c.Missing("s"); !strings.Contains(m, `key "k": 2 of 3`) || !strings.Contains(m, "unkeyed: 0 of 1") {
		t.Fatalf("Missing = %q", m)
	}
	c.Delivered("s", "k", 2)
	c.Acked("s", "k", 2)
	c.Delivered("s", "", 0)
	c.Acked("s", "", 0)
	if !c.Complete("s") {
		t.Fatalf("not complete: %s", c.Missing("s"))
	}
	if st := c.Stats("s"); st.Deliveries != 5 || st.Redeliveries != 1 || st.Acks != 4 {
		t.Fatalf("stats = %+v", st)
	}
}

// After a kill, a key may go back to a message acked before, but must then
// go on in order from there; before the kill that is a violation.
func TestCheckerAcksMayBeLost(t *testing.T) {
	c := New()
	for i := range 4 {
		c.Published("k", i)
		c.Delivered("s", "k", i)
		c.Acked("s", "k", i)
	}
	c.Delivered("s", "k", 2)
	c.Released("s", "k", 2)
	if v := c.Violations(); len(v) != 1 || !strings.Contains(v[0], "delivered again after it was acked") {
		t.Fatalf("before AcksMayBeLost: violations %v", v)
	}
	c = New()
	for i := range 4 {
		c.Published("k", i)
	}
	c.Delivered("s", "k", 0)
	c.Acked("s", "k", 0)
	c.Delivered("s", "k", 1)
	c.Acked("s", "k", 1)
	c.AcksMayBeLost()
	c.Delivered("s", "k", 0) // the ack of 0 was lost: back to 0, then on in order
	c.Acked("s", "k", 0)
	c.Delivered("s", "k", 2) // skipping 1 is still a violation
	if v := c.Violations(); len(v) != 1 || !strings.Contains(v[0], "message 2 delivered before message 1 was acked") {
		t.Fatalf("violations %v", v)
	}
	c.Released("s", "k", 2)
	for _, i := range []int{1, 2, 3} {
		c.Delivered("s", "k", i)
		c.Acked("s", "k", i)
	}
	if !c.Complete("s") {
		t.Fatalf("not complete: %s", c.Missing("s"))
	}
	if st := c.Stats("s"); st.Rewinds != 1 || st.Redeliveries != 3 {
		t.Fatalf("stats = %+v, want 1 rewind and 3 redeliveries (0, 1, and 2 again)", st)
	}
}

func TestEncodeDecode(t *testing.T) {
	key, idx, err := Decode(Encode("a|b", 42))
	if err != nil || key != "a|b" || idx != 42 {
		t.Fatalf("Decode = %q %d %v", key, idx, err)
	}
	if _, _, err := Decode([]byte("nobar")); err == nil {
		t.Fatal("Decode accepted a payload without index")
	}
}

// The pipelined checker must catch what pipelined ordering forbids, and
// pass what it allows.
func TestPipelinedCheckerCatchesViolations(t *testing.T) {
	tests := []checkerCase{
		{"next before ack", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Released("s", "k", 0) // handler returned, ack to come
			c.Delivered("s", "k", 1)
			c.Acked("s", "k", 1)
		}, ""},
		{"nack brings back it and the later ones", func(c *Checker) {
			for i := range 3 {
				c.Delivered("s", "k", i)
				c.Acked("s", "k", i)
			}
			c.Delivered("s", "k", 3)
			c.Released("s", "k", 3) // nacked
			c.Delivered("s", "k", 4)
			c.Acked("s", "k", 4) // still in flight: its ack is dropped
			c.Delivered("s", "k", 3)
			c.Acked("s", "k", 3)
			c.Delivered("s", "k", 4)
			c.Acked("s", "k", 4)
		}, ""},
		{"skips ahead", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Acked("s", "k", 0)
			c.Delivered("s", "k", 2)
		}, "message 1 skipped"},
		{"goes back without the later ones", func(c *Checker) {
			for i := range 3 {
				c.Delivered("s", "k", i)
				c.Released("s", "k", i)
			}
			c.Delivered("s", "k", 1) // back to 1: 2 must follow, not 3
			c.Released("s", "k", 1)
			c.Delivered("s", "k", 3)
		}, "message 2 skipped"},
		{"acked message comes back", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Acked("s", "k", 0)
			c.Delivered("s", "k", 1)
			c.Acked("s", "k", 1)
			c.Delivered("s", "k", 0)
		}, "again after it was acked"},
		{"two of a key in handlers", func(c *Checker) {
			c.Delivered("s", "k", 0)
			c.Delivered("s", "k", 1)
		}, "while message 0 is unacked"},
	}
	runCases(t, NewPipelined, tests)
}

// checkerCase is a run of calls on a fresh checker and the first violation
// it must report ("" for none).
type checkerCase struct {
	name string
	run  func(c *Checker)
	want string
}

func runCases(t *testing.T, newChecker func() *Checker, tests []checkerCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newChecker()
			tt.run(c)
			v := c.Violations()
			switch {
			case tt.want == "" && len(v) > 0:
				t.Fatalf("unexpected violations: %v", v)
			case tt.want != "" && (len(v) == 0 || !strings.Contains(v[0], tt.want)):
				t.Fatalf("violations %v, want one containing %q", v, tt.want)
			}
		})
	}
}

func TestPipelinedCheckerCompleteOnlyWhenThePrefixIsAcked(t *testing.T) {
	c := NewPipelined()
	for i := range 3 {
		c.Published("k", i)
	}
	c.Delivered("s", "k", 0)
	c.Acked("s", "k", 0)
	c.Delivered("s", "k", 1)
	c.Released("s", "k", 1) // nacked
	c.Delivered("s", "k", 2)
	c.Acked("s", "k", 2) // in flight when 1 was nacked: comes again
	if c.Complete("s") {
		t.Fatal("complete while message 1 is unacked")
	}
	c.Delivered("s", "k", 1)
	c.Acked("s", "k", 1)
	c.Delivered("s", "k", 2)
	c.Acked("s", "k", 2)
	if !c.Complete("s") {
		t.Fatalf("not complete: %s", c.Missing("s"))
	}
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

func TestPipelinedCheckerAckAfterHandlerReturned(t *testing.T) {
	c := NewPipelined()
	c.Delivered("s", "k", 0)
	c.Released("s", "k", 0) // handler returned; acked later
	c.Delivered("s", "k", 1)
	c.Acked("s", "k", 0) // while 1 runs
	c.Acked("s", "k", 1)
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	c.Acked("s", "k", 5)
	if v := c.Violations(); len(v) != 1 || !strings.Contains(v[0], "not out") {
		t.Fatalf("ack of a message never delivered: violations %v", v)
	}
}
