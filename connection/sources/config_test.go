package sources

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
)

func TestExecConfigPolicies(t *testing.T) {
	cluster := &clientcmdv1.Cluster{Extensions: []clientcmdv1.NamedExtension{
		{Name: execExtension, Extension: runtime.RawExtension{Raw: []byte(`{"region":"eu"}`)}},
		{Name: extraArgsExtension, Extension: runtime.RawExtension{Raw: []byte(`["--audience","fleet"]`)}},
		{Name: extraEnvExtension, Extension: runtime.RawExtension{Raw: []byte(`{"CLIENT_ID":"from-profile","TENANT":"t1"}`)}},
	}}
	base := clientcmdv1.ExecConfig{Command: "plugin", Args: []string{"get-token"}, Env: []clientcmdv1.ExecEnvVar{{Name: "CLIENT_ID", Value: "from-file"}}}
	cases := []struct {
		args, env string
		wantArgs  string
		wantEnv   string
	}{
		{"", "", "get-token", "CLIENT_ID=from-file"},
		{"Append", "AppendIfNotExists", "get-token --audience fleet", "CLIENT_ID=from-file TENANT=t1"},
		{"Ignore", "Replace", "get-token", "CLIENT_ID=from-profile TENANT=t1"},
	}
	for _, tc := range cases {
		t.Run(tc.args+"/"+tc.env, func(t *testing.T) {
			e := base
			p := &Provider{Name: "p", ExecConfig: &e, ProfileSourcedCLIArgsPolicy: tc.args, ProfileSourcedEnvVarsPolicy: tc.env}
			out, err := execConfig(p, cluster)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(out.Args, " "); got != tc.wantArgs {
				t.Errorf("args %q, want %q", got, tc.wantArgs)
			}
			var env []string
			for _, v := range out.Env {
				env = append(env, v.Name+"="+v.Value)
			}
			if got := strings.Join(env, " "); got != tc.wantEnv {
				t.Errorf("env %q, want %q", got, tc.wantEnv)
			}
			if u, ok := out.Config.(*runtime.Unknown); !ok || string(u.Raw) != `{"region":"eu"}` {
				t.Errorf("exec extension not passed as the plugin's cluster config: %#v", out.Config)
			}
			if len(base.Args) != 1 {
				t.Fatal("the provider file's args were changed in place")
			}
		})
	}
}

func TestArgoRESTConfig(t *testing.T) {
	mgmt := &rest.Config{Host: "https://management"}
	secret := func(server, config string) *corev1.Secret {
		return &corev1.Secret{Data: map[string][]byte{"server": []byte(server), "config": []byte(config)}}
	}
	cases := []struct {
		name    string
		sec     *corev1.Secret
		want    string // Host of the result
		wantErr string
	}{
		{"bearer token", secret("https://leaf:6443", `{"bearerToken":"t","tlsClientConfig":{"insecure":true}}`), "https://leaf:6443", ""},
		{"in-cluster", secret("https://kubernetes.default.svc", `{"tlsClientConfig":{"insecure":false}}`), "https://management", ""},
		{"in-cluster with a token is not the management cluster", secret("https://kubernetes.default.svc/", `{"bearerToken":"t"}`), "https://kubernetes.default.svc/", ""},
		{"no server", secret("", `{}`), "", `no "server" field`},
		{"server not a URL", secret("leaf:6443", `{}`), "", "is not an http(s) URL"},
		{"garbage config", secret("https://leaf", `{{`), "", `"config" field`},
		{"aws", secret("https://leaf", `{"awsAuthConfig":{"clusterName":"x"}}`), "", "awsAuthConfig"},
		{"bad CA", secret("https://leaf", `{"tlsClientConfig":{"caData":"bm90IGEgY2VydA=="}}`), "", "no PEM certificate"},
		{"cert without key", secret("https://leaf", `{"tlsClientConfig":{"certData":"eA=="}}`), "", "both certData and keyData"},
		{"exec without command", secret("https://leaf", `{"execProviderConfig":{"args":["x"]}}`), "", "no command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := argoRESTConfig(tc.sec, mgmt)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error holding %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.want {
				t.Errorf("host %q, want %q", cfg.Host, tc.want)
			}
		})
	}
}
