package graph

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Media types of GraphQL over HTTP responses.
const (
	mediaJSON            = "application/json"
	mediaGraphQLResponse = "application/graphql-response+json"
)

// postTransport is GraphQL over HTTP POST, following the GraphQL over HTTP
// spec where gqlgen's transport.POST does not:
//
//   - the body is JSON (application/json). A body sent as
//     application/x-www-form-urlencoded, which is what `curl -d` sends, is
//     accepted too when the request carries an Authorization header: it is
//     read as JSON when it is a JSON object, else as the form fields query,
//     operationName, variables and extensions (the last two JSON), as the
//     spec encodes a GET. Without Authorization a form could come from any
//     web page a signed-in user visits (browsers send forms across sites
//     without asking), so it is refused. Any other content type is 415
//     (see postBody);
//   - the response media type is negotiated from Accept (application/json
//     for legacy clients, */* and no Accept; application/graphql-response+json
//     when asked for) and always carries charset=utf-8;
//   - a request that cannot execute (malformed JSON or no query: 400; parse,
//     validation, limit or variable errors: 200 with application/json, 400
//     with application/graphql-response+json) gets no "data" entry;
//   - the response is written once, without re-encoding the data gqlgen
//     already produced.
//
// The body size is capped before this runs (Handler.limitBody).
type postTransport struct{}

var _ graphql.Transport = postTransport{}

// mediaForm is the content type of HTML forms and of `curl -d`.
const mediaForm = "application/x-www-form-urlencoded"

// postBody reads a POST's Content-Type: form says the body is sent as a
// form (see postTransport); problem, when set, is why the server cannot
// read it, for a 415 answer that names the content type it wants.
func postBody(r *http.Request) (form bool, problem string) {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return false, "the request has no Content-Type: send the GraphQL request as JSON with Content-Type: application/json"
	}
	mt, _, err := mime.ParseMediaType(ct)
	switch {
	case err != nil:
		return false, fmt.Sprintf("Content-Type %q does not parse: send the GraphQL request as JSON with Content-Type: application/json", ct)
	case mt == mediaJSON:
		return false, ""
	case mt == mediaForm && r.Header.Get("Authorization") != "":
		return true, ""
	case mt == mediaForm:
		return true, "Content-Type application/x-www-form-urlencoded is accepted only with an Authorization header " +
			"(any web page can send a form); send the GraphQL request as JSON with Content-Type: application/json"
	}
	return false, fmt.Sprintf("Content-Type %s is not supported: send the GraphQL request as JSON with Content-Type: application/json", mt)
}

// Supports implements graphql.Transport.
func (postTransport) Supports(r *http.Request) bool {
	if r.Header.Get("Upgrade") != "" || r.Method != http.MethodPost {
		return false
	}
	_, problem := postBody(r)
	return problem == ""
}

// Do implements graphql.Transport.
func (postTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	ctx := r.Context()
	media := responseMedia(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", media+"; charset=utf-8")
	start := graphql.Now()
	form, _ := postBody(r)
	params, err := readParams(r.Body, form)
	if err == nil && params.Query == "" {
		err = errors.New("the query parameter is missing")
	}
	if err != nil {
		writeGraphQL(w, http.StatusBadRequest, &graphql.Response{Errors: gqlerror.List{{
			Message:    "the body is not a GraphQL request (a JSON object with query, and optionally operationName, variables, extensions): " + err.Error(),
			Extensions: map[string]any{"code": CodeBadRequest},
		}}}, false)
		return
	}
	params.Headers = r.Header
	params.ReadTime = graphql.TraceTiming{Start: start, End: graphql.Now()}
	opCtx, errs := exec.CreateOperationContext(ctx, params)
	if errs != nil {
		status := http.StatusOK
		if media == mediaGraphQLResponse {
			status = http.StatusBadRequest
		}
		writeGraphQL(w, status, exec.DispatchError(graphql.WithOperationContext(ctx, opCtx), errs), false)
		return
	}
	responses, ctx := exec.DispatchOperation(ctx, opCtx)
	writeGraphQL(w, http.StatusOK, responses(ctx), true)
}

// readParams reads the request parameters from a JSON body, or from a
// form body that is either a JSON object or form fields.
func readParams(body io.Reader, form bool) (*graphql.RawParams, error) {
	var params graphql.RawParams
	if form {
		b, err := io.ReadAll(body)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
			return formParams(string(b))
		}
		body = bytes.NewReader(b)
	}
	dec := json.NewDecoder(body)
	dec.UseNumber()
	if err := dec.Decode(&params); err != nil {
		return nil, err
	}
	return &params, nil
}

// formParams reads the parameters from form fields.
func formParams(body string) (*graphql.RawParams, error) {
	v, err := url.ParseQuery(body)
	if err != nil {
		return nil, fmt.Errorf("the form does not parse: %w", err)
	}
	params := &graphql.RawParams{Query: v.Get("query"), OperationName: v.Get("operationName")}
	for _, f := range []struct {
		name string
		into *map[string]any
	}{{"variables", &params.Variables}, {"extensions", &params.Extensions}} {
		if raw := v.Get(f.name); raw != "" {
			dec := json.NewDecoder(strings.NewReader(raw))
			dec.UseNumber()
			if err := dec.Decode(f.into); err != nil {
				return nil, fmt.Errorf("the %s field is not a JSON object: %w", f.name, err)
			}
		}
	}
	return params, nil
}

// responseMedia picks the response media type from an Accept header: the
// first of application/json or application/graphql-response+json it
// names; application/json for */*, application/*, nothing, or only media
// types this server does not produce.
func responseMedia(accept string) string {
	for part := range strings.SplitSeq(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case mediaJSON, "*/*", "application/*":
			return mediaJSON
		case mediaGraphQLResponse:
			return mediaGraphQLResponse
		}
	}
	return mediaJSON
}

// writeGraphQL writes a GraphQL response. executed says whether the
// operation ran, in which case "data" is present (null when an error
// nulled it); a request that never executed has no "data" entry. The data
// gqlgen produced is written as is, not copied or re-encoded.
func writeGraphQL(w http.ResponseWriter, status int, resp *graphql.Response, executed bool) {
	if resp == nil {
		resp = &graphql.Response{}
	}
	var head, tail bytes.Buffer
	head.WriteByte('{')
	if len(resp.Errors) > 0 {
		head.WriteString(`"errors":`)
		writeJSON(&head, resp.Errors)
	}
	var data []byte
	if executed {
		if head.Len() > 1 {
			head.WriteByte(',')
		}
		head.WriteString(`"data":`)
		data = resp.Data
		if len(data) == 0 {
			data = []byte("null")
		}
	}
	if len(resp.Extensions) > 0 {
		if head.Len() > 1 || data != nil {
			tail.WriteByte(',')
		}
		tail.WriteString(`"extensions":`)
		writeJSON(&tail, resp.Extensions)
	}
	tail.WriteByte('}')
	w.Header().Set("Content-Length", strconv.Itoa(head.Len()+len(data)+tail.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(head.Bytes())
	_, _ = w.Write(data)
	_, _ = w.Write(tail.Bytes())
}

// writeJSON appends v as JSON; a value that cannot be encoded (which
// errors and extensions never are) is written as null.
func writeJSON(b *bytes.Buffer, v any) {
	out, err := json.Marshal(v)
	if err != nil {
		out = []byte("null")
	}
	b.Write(out)
}
