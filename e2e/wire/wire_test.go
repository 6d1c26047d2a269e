package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func envelope(flags byte, msg string) []byte {
	var b bytes.Buffer
	b.WriteByte(flags)
	_ = binary.Write(&b, binary.BigEndian, uint32(len(msg)))
	b.WriteString(msg)
	return b.Bytes()
}

func TestReadProcessStream(t *testing.T) {
	tests := []struct {
		name    string
		frames  [][]byte
		want    Result
		wantErr string
	}{
		{
			name: "output and exit code",
			frames: [][]byte{
				envelope(0, `{"event":{"start":{"pid":42}}}`),
				envelope(0, `{"event":{"data":{"stdout":"aGkK"}}}`),
				envelope(0, `{"event":{"data":{"stderr":"ZQ=="}}}`),
				envelope(0, `{"event":{"keepalive":{}}}`),
				envelope(0, `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}`),
				envelope(2, `{}`),
			},
			want: Result{Stdout: "hi\n", Stderr: "e", ExitCode: 3, Status: "exit status 3"},
		},
		{
			name: "zero exit code omitted",
			frames: [][]byte{
				envelope(0, `{"event":{"start":{"pid":1}}}`),
				envelope(0, `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`),
				envelope(2, `{}`),
			},
			want: Result{Status: "exit status 0"},
		},
		{
			name: "error trailer",
			frames: [][]byte{
				envelope(2, `{"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}}`),
			},
			wantErr: "cwd '/nope' does not exist",
		},
		{
			name:    "truncated",
			frames:  [][]byte{envelope(0, `{"event":{"start":{"pid":1}}}`)},
			wantErr: "process stream",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readProcessStream(bufio.NewReader(bytes.NewReader(bytes.Join(tt.frames, nil))))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *got != tt.want {
				t.Fatalf("got %+v, want %+v", *got, tt.want)
			}
		})
	}
}
