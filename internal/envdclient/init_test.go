package envdclient

import (
	"encoding/json"
	"testing"
)

// envd tells "keep" from "set" by presence: a nil env and an absent token
// keep what envd has; an empty env and an empty token clear them.
func TestInitWireShape(t *testing.T) {
	empty := ""
	for _, tc := range []struct {
		name string
		in   Init
		want string
	}{
		{"keep everything", Init{}, `{"envVars":null}`},
		{"clear env and token", Init{EnvVars: map[string]string{}, AccessToken: &empty}, `{"envVars":{},"accessToken":""}`},
		{"full", Init{EnvVars: map[string]string{"A": "1"}, DefaultUser: "user", StartCmd: "x", MaxCommandSeconds: 5},
			`{"envVars":{"A":"1"},"defaultUser":"user","startCmd":"x","maxCommandSeconds":5}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got %s, want %s", b, tc.want)
			}
			var back Init
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if (back.EnvVars == nil) != (tc.in.EnvVars == nil) || (back.AccessToken == nil) != (tc.in.AccessToken == nil) {
				t.Fatalf("keep/set lost in the round trip: %+v", back)
			}
		})
	}
}
