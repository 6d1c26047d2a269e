package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	tests := []struct {
		level, format string
		wantErr       string // names the flag; "" = valid
		json          bool
	}{
		{level: "info", format: "text"},
		{level: "debug", format: ""},
		{level: "warn", format: "json", json: true},
		{level: "info", format: "yaml", wantErr: "--log-format"},
		{level: "loud", format: "json", wantErr: "--log-level"},
	}
	for _, tc := range tests {
		t.Run(tc.level+"/"+tc.format, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := newLogger(&buf, tc.level, tc.format)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v does not name %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Error("boom", "sandbox", "a b")
			var rec map[string]any
			isJSON := json.Unmarshal(buf.Bytes(), &rec) == nil && rec["msg"] == "boom" && rec["sandbox"] == "a b"
			if isJSON != tc.json {
				t.Errorf("format %q wrote %q (JSON: %v)", tc.format, buf.String(), isJSON)
			}
		})
	}
}
