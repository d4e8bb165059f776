(* derivc proof library: everything an obligation needs, in one module. *)
Require Export Derivc.Algebra.
Require Export Derivc.Sum.
Require Export Derivc.Rules.Split.
Require Export Derivc.Rules.Assoc.
Require Export Derivc.Rules.Mask.
Require Export Derivc.Rules.Fuse.
Require Export Derivc.Rules.Cache.
Require Export Derivc.Rules.Reorder.
Require Export Derivc.Rules.Tile.
Require Export Derivc.Rules.Parallel.
Require Export Derivc.Rules.SplitSoftmax.
Require Export Derivc.Rules.OnlineAgg.
Require Export Derivc.Rules.MapMma.
Require Export Derivc.Tactics.
Require Export Derivc.Rules.Recompute.
Require Export Derivc.Rules.SoftmaxBwd.
Require Export Derivc.Rules.SoftmaxVjp.
