package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// gRPC's log reaches the sidecar's: errors at error level, warnings at
// debug, info never.
func TestGRPCLog(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  []string // level msg
	}{
		{slog.LevelDebug, []string{"DEBUG warning 1", "DEBUG warning a b", "ERROR error 2", "ERROR error c d"}},
		{slog.LevelInfo, []string{"ERROR error 2", "ERROR error c d"}},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var out bytes.Buffer
			g := grpcLog{newLogger(&out, "json", tc.level)}
			g.Info("info")
			g.Infof("info %d", 0)
			g.Warningf("warning %d", 1)
			g.Warningln("warning", "a", "b")
			g.Errorf("error %d", 2)
			g.Errorln("error", "c", "d")
			if g.V(0) {
				t.Error("V(0) is true: gRPC would build info lines nobody sees")
			}
			var got []string
			for line := range strings.Lines(out.String()) {
				var m map[string]any
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				got = append(got, m["level"].(string)+" "+m["msg"].(string))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
