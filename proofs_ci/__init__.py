"""derivc proof CI: the rule -> theorem table and checks over the Lean and Coq libraries."""
