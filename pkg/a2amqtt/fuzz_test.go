package a2amqtt

import (
	"encoding/json"
	"reflect"
	"regexp"
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
	// A repeated "params" merges in a one-pass decode but not in the two-pass one.
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}],"taskId":"0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11"}},"Params":{"configuration":{}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","method":"SendMessage","par\u0061ms":{"metadata":{"a":1}},"params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}],"taskId":"0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11"}}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		for i, lim := range []DecodeLimits{{MaxPayloadBytes: 256, RequireTaskID: true}, {}, {MaxPayloadBytes: 256, RequireTaskID: true}, {}} {
			// The last two run the responder's one-pass variant (params into a2a-go's type).
			full := i >= 2
			req, err := decodeRequest(payload, lim, full)
			if full {
				checkOnePassMatchesTwoPass(t, payload, lim, req, err)
			}
			checkDecodeVerdict(t, payload, lim, req, err)
		}
	})
}

// checkOnePassMatchesTwoPass: the one-pass decode of send requests answers exactly what the
// two-pass decode (the previous decoder, kept behind it) does: the same verdict, the same error,
// the same request (Params, the raw params the two-pass decode keeps, aside: nothing reads it
// once they are decoded).
func checkOnePassMatchesTwoPass(t *testing.T, payload []byte, lim DecodeLimits, req *InboundRequest, err error) {
	t.Helper()
	slow, serr := decodeRequestVia(payload, lim, true, false)
	switch {
	case (err == nil) != (serr == nil):
		t.Fatalf("one-pass %v vs two-pass %v", err, serr)
	case err != nil && !sameDecodeError(err, serr):
		t.Fatalf("errors differ: one-pass %#v, two-pass %#v", err, serr)
	case err == nil:
		fast := *req
		fast.Params, slow.Params = nil, nil
		if !reflect.DeepEqual(&fast, slow) {
			t.Fatalf("one-pass %+v vs two-pass %+v", fast, slow)
		}
		if req.send != nil && req.send.Message != nil && string(req.send.Message.TaskID) != req.TaskID {
			t.Fatalf("one-pass decode: ids %q vs message %q", req.TaskID, req.send.Message.TaskID)
		}
	}
}

// checkDecodeVerdict: a rejection is a JSON-RPC error the responder can publish; an accepted
// request has a method and dialect and keeps the limits.
func checkDecodeVerdict(t *testing.T, payload []byte, lim DecodeLimits, req *InboundRequest, err error) {
	t.Helper()
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
		return
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

// errorTimestamp is the time an error's ErrorInfo was built (it may differ between two calls).
var errorTimestamp = regexp.MustCompile(`"timestamp":"[^"]*"`)

// sameDecodeError: the same request id and JSON-RPC error, the ErrorInfo's timestamp aside.
func sameDecodeError(a, b error) bool {
	x, y := a.(*DecodeError), b.(*DecodeError)
	return reflect.DeepEqual(x.ID, y.ID) && x.Err.Code == y.Err.Code && x.Err.Message == y.Err.Message &&
		errorTimestamp.ReplaceAllString(string(x.Err.Data), "") == errorTimestamp.ReplaceAllString(string(y.Err.Data), "")
}

// FuzzDecodeStreamReply: the requester's direct decode of stream items accepts and refuses
// exactly what decoding into a2a-go's a2a.StreamResponse does, with the same results.
func FuzzDecodeStreamReply(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","result":{"artifactUpdate":{"taskId":"t","contextId":"c","append":true,"artifact":{"artifactId":"a","parts":[{"text":"x"}]}}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"hi"}]}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"}}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","error":{"code":-32001,"message":"task not found"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"1","result":{}}`))
	f.Add([]byte(`{"result":{"task":{"id":"t"},"message":{"messageId":"m"}}}`))
	// A repeated "result" merges in the direct decode; a2a-go's keeps only the last.
	f.Add([]byte(`{"result":{"task":{"id":"t"}},"RESULT":{"message":{"messageId":"m"}}}`))
	f.Add([]byte(`{"result":{"task":{"id":"t"}},"result":{}}`))
	f.Add([]byte(`{"result":{"task":{"id":"t"}},"Result":{"task":{"contextId":"c"}}}`))
	f.Add([]byte(`{"result":{"task":{"id":"t"}},"res\u0075lt":null}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, rpcErr, err := decodeStreamReply(payload)
		wantEv, wantRPCErr, wantErr := decodeStreamReplyA2A(payload)
		if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("error %v, a2a-go %v", err, wantErr)
		}
		if !reflect.DeepEqual(ev, wantEv) || !reflect.DeepEqual(rpcErr, wantRPCErr) {
			t.Fatalf("decoded %#v %#v, a2a-go %#v %#v", ev, rpcErr, wantEv, wantRPCErr)
		}
	})
}
