package a2amqtt

import (
	"encoding/json"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// The SDK's one-pass decoders against the decoders they replace, in the same run
// (go test -run '^$' -bench Decode ./pkg/a2amqtt/): the responder's request decode with and
// without the one-pass send path, the requester's stream-item decode direct and through
// a2a-go's a2a.StreamResponse. Both pairs answer the same (FuzzDecodeRequest, FuzzDecodeStreamReply).

var benchRequest = []byte(`{"jsonrpc":"2.0","id":"5d0c1a52-7d7e-4b0e-9f3e-3a2b1c0d9e8f","method":"SendMessage","params":{"message":{"messageId":"1a6f0e7e-2d55-4c5b-8a8e-0d4f3b2a1c9e","role":"ROLE_USER","parts":[{"text":"hello, this is a benchmark payload of a typical size for an agent request"}],"taskId":"0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11","contextId":"8c3e6f1a-0b2d-4e5f-9a7b-6c8d0e2f4a1b"},"configuration":{"blocking":true}}}`)

func BenchmarkDecodeRequest(b *testing.B) {
	lim := DecodeLimits{RequireTaskID: true}
	for _, v := range []struct {
		name    string
		onePass bool
	}{{"two-pass", false}, {"one-pass", true}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if req, err := decodeRequestVia(benchRequest, lim, true, v.onePass); err != nil || req.send == nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeStreamReply(b *testing.B) {
	task := &a2a.Task{ID: "0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11", ContextID: "8c3e6f1a-0b2d-4e5f-9a7b-6c8d0e2f4a1b"}
	result, err := json.Marshal(a2a.StreamResponse{Event: a2a.NewArtifactUpdateEvent(task, "a", a2a.NewTextPart("a 64-byte chunk of an artifact streamed to the requester, item.."))})
	if err != nil {
		b.Fatal(err)
	}
	payload, err := json.Marshal(rpcResponse{JSONRPC: jsonrpcVersion, ID: "1", Result: result})
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct {
		name   string
		decode func([]byte) (a2a.Event, *RPCError, error)
	}{{"a2a-go", decodeStreamReplyA2A}, {"direct", decodeStreamReply}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if ev, _, err := v.decode(payload); err != nil || ev == nil {
					b.Fatal(err)
				}
			}
		})
	}
}
