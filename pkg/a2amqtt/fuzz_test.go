package a2amqtt

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeRequest feeds arbitrary payloads to the inbound decoder: it
// must never panic, and every rejection must be a well-formed JSON-RPC
// error the responder can publish. Seed corpus: testdata/fuzz/FuzzDecodeRequest.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}],"taskId":"0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11","contextId":"c"}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"text","text":"x"}]}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":null,"method":"GetTask","params":{"id":"t"}}`))
	f.Add([]byte(`[{"jsonrpc":"2.0"}]`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":{},"method":"SendMessage"}`))
	f.Add([]byte("\xff\xfe"))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, payload []byte) {
		for i, lim := range []DecodeLimits{{MaxPayloadBytes: 256, RequireTaskID: true}, {}, {MaxPayloadBytes: 256, RequireTaskID: true}, {}} {
			// The last two run the responder's one-pass variant (params into a2a-go's type).
			full := i >= 2
			req, err := decodeRequest(payload, lim, full)
			if full && err == nil && req.send != nil && req.send.Message != nil && string(req.send.Message.TaskID) != req.TaskID {
				t.Fatalf("one-pass decode: ids %q vs message %q", req.TaskID, req.send.Message.TaskID)
			}
			if err != nil {
				de, ok := err.(*DecodeError)
				if !ok || de.Err == nil || de.Err.Code == 0 || de.Err.Message == "" {
					t.Fatalf("rejection is not a usable JSON-RPC error: %#v", err)
				}
				out := encodeError(de.ID, de.Err)
				var back rpcResponse
				if jerr := json.Unmarshal(out, &back); jerr != nil || back.Error == nil || back.Error.Code != de.Err.Code {
					t.Fatalf("error reply does not round-trip: %v %s", jerr, out)
				}
				continue
			}
			if req.Method == "" || req.Dialect == 0 {
				t.Fatalf("accepted request without method/dialect: %+v", req)
			}
			if lim.MaxPayloadBytes > 0 && len(payload) > lim.MaxPayloadBytes {
				t.Fatalf("accepted oversized payload (%d bytes)", len(payload))
			}
			if lim.RequireTaskID && methods[req.Method].send && req.Dialect == DialectV1 && !validTaskID(req.TaskID) {
				t.Fatalf("accepted v1 send without a valid Task.id: %q", req.TaskID)
			}
		}
	})
}
