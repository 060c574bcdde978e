package authz_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fleetgraph/fleetgraph/authz"
)

// A token file: one "token,user,uid,groups" line per token. Names that
// would pass for Kubernetes' own (system:...) are refused unless the
// Naming allows them.
func ExampleParseStaticTokens() {
	file := `# token,user,uid,groups
alice-token,alice,alice,"team-a,oncall"
bob-token,bob,bob,
`
	tokens, err := authz.ParseStaticTokens(strings.NewReader(file), "tokens.csv", authz.Naming{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tok := range []string{"alice-token", "bob-token", "guess"} {
		u, err := tokens.Authenticate(context.Background(), authz.Credentials{Token: tok})
		switch {
		case errors.Is(err, authz.ErrNotApplicable):
			fmt.Printf("%s: not a token of this file\n", tok)
		case err != nil:
			fmt.Printf("%s: %v\n", tok, err)
		default:
			fmt.Printf("%s: %s %v\n", tok, u.GetName(), u.GetGroups())
		}
	}

	_, err = authz.ParseStaticTokens(strings.NewReader("root-token,root,root,system:masters\n"), "tokens.csv", authz.Naming{})
	fmt.Println(err)
	// Output:
	// alice-token: alice [team-a oncall]
	// bob-token: bob []
	// guess: not a token of this file
	// malformed token file tokens.csv, line 1: reserved system: name: group "system:masters" of user "root" (this authenticator may not assert system: groups)
}
