(* Why cached decode can reuse stored K and V rows: causal reuse, over any carrier type.

   A decoder stack is modelled by what it is made of: an embedding, per layer a row-wise map
   from a row (at a position) to its query, key and value, attention of one query over the K and
   V rows of positions 0..t, and a row-wise map after attention (output product, residual,
   feed-forward). Naive decode recomputes every row of every layer for all T tokens; cached decode
   runs only the new row, reading the K and V rows stored by earlier steps. The theorem: the
   cached row equals the naive forward's row T-1, and the cache after the step is exactly what
   naive decode computes for the longer sequence, so the argument repeats step after step.

   Nothing here is about floats: the carrier types are arbitrary. It holds in float32 under one
   hypothesis, same_fold_order: both paths compute a row's attention by the same function of its
   query and the K and V rows of 0..t (the same fold, in the same order). In the C++ that is
   checked by the kernel-against-reference property (tests/test_kernels.cpp) and by P1, naive ==
   cached bit for bit at every step (tests/test_decode.cpp, proofs/verify.cpp). The masked
   columns of naive attention are the subject of the binary32 proofs. *)
(* main: cached_row_equals_naive cache_after_step *)

From Coq Require Import List Arith Lia.
Import ListNotations.

Section CausalReuse.
  Variables Tok X Q K V A : Type.
  Variable embed : Tok -> X.
  (* Layer l's query, key and value of row x at position t (RoPE makes them depend on t). *)
  Variable qkv : nat -> nat -> X -> Q * (K * V).
  (* Layer l's row-wise work after attention: output product, residual, feed-forward. *)
  Variable post : nat -> X -> A -> X.
  (* One query's attention over the K and V rows of positions 0..t, as each path computes it. *)
  Variables attend_naive attend_cached : Q -> list (K * V) -> A.

  (* The one hypothesis: the two paths compute attention the same way. *)
  Definition same_fold_order : Prop := forall q kvs, attend_naive q kvs = attend_cached q kvs.

  Definition q_of l t x := fst (qkv l t x).
  Definition kv_of l t x := snd (qkv l t x).

  (* Layer l's K and V rows of xs, at positions t, t+1, ... *)
  Fixpoint kvs_from (l t : nat) (xs : list X) : list (K * V) :=
    match xs with
    | [] => []
    | x :: r => kv_of l t x :: kvs_from l (S t) r
    end.

  (* Naive attention: the row at position t reads the first t+1 rows of all. *)
  Fixpoint layer_rows (l t : nat) (all : list (K * V)) (xs : list X) : list X :=
    match xs with
    | [] => []
    | x :: r => post l x (attend_naive (q_of l t x) (firstn (S t) all)) :: layer_rows l (S t) all r
    end.

  Definition layer_naive (l : nat) (xs : list X) : list X := layer_rows l 0 (kvs_from l 0 xs) xs.

  (* The residual stream after n layers, every row recomputed: naive decode. *)
  Fixpoint hidden (n : nat) (xs : list X) : list X :=
    match n with
    | 0 => xs
    | S m => layer_naive m (hidden m xs)
    end.

  (* Cached decode of one new row x at position t through n layers; cache l holds layer l's K
     and V rows of positions 0..t-1. Write first, then read: the row attends over the cache plus
     its own K and V. *)
  Fixpoint cached_row (n : nat) (cache : nat -> list (K * V)) (t : nat) (x : X) : X :=
    match n with
    | 0 => x
    | S m =>
        let y := cached_row m cache t x in
        post m y (attend_cached (q_of m t y) (cache m ++ [kv_of m t y]))
    end.

  Lemma kvs_from_length : forall l xs t, length (kvs_from l t xs) = length xs.
  Proof. induction xs; simpl; auto. Qed.

  Lemma kvs_from_app : forall l ys y t,
    kvs_from l t (ys ++ [y]) = kvs_from l t ys ++ [kv_of l (t + length ys) y].
  Proof.
    induction ys as [| z ys IH]; intros y t; simpl.
    - rewrite Nat.add_0_r. reflexivity.
    - rewrite IH. replace (t + S (length ys)) with (S t + length ys) by lia. reflexivity.
  Qed.

  Lemma layer_rows_length : forall l all xs t, length (layer_rows l t all xs) = length xs.
  Proof. induction xs; simpl; auto. Qed.

  Lemma hidden_length : forall n xs, length (hidden n xs) = length xs.
  Proof.
    induction n; intros xs; simpl; auto.
    unfold layer_naive. rewrite layer_rows_length. auto.
  Qed.

  (* Rows that exist already never read what comes after them: causality. *)
  Lemma layer_rows_extend : forall l xs t all extra,
    t + length xs <= length all ->
    layer_rows l t (all ++ extra) xs = layer_rows l t all xs.
  Proof.
    induction xs as [| x xs IH]; intros t all extra Hlen; cbn [layer_rows length] in *; auto.
    rewrite firstn_app. replace (S t - length all) with 0 by lia. rewrite app_nil_r.
    rewrite IH by lia. reflexivity.
  Qed.

  Lemma layer_rows_app : forall l ys y t all,
    layer_rows l t all (ys ++ [y]) =
      layer_rows l t all ys ++ [post l y (attend_naive (q_of l (t + length ys) y) (firstn (S (t + length ys)) all))].
  Proof.
    induction ys as [| z ys IH]; intros y t all; simpl.
    - rewrite Nat.add_0_r. reflexivity.
    - rewrite IH. replace (t + S (length ys)) with (S t + length ys) by lia. reflexivity.
  Qed.

  (* One more row: the naive layer's old rows are unchanged, and the new one reads all of them. *)
  Lemma layer_naive_snoc : forall l ys y,
    layer_naive l (ys ++ [y]) =
      layer_naive l ys ++ [post l y (attend_naive (q_of l (length ys) y) (kvs_from l 0 ys ++ [kv_of l (length ys) y]))].
  Proof.
    intros l ys y. unfold layer_naive.
    rewrite kvs_from_app, layer_rows_app, !Nat.add_0_l.
    rewrite layer_rows_extend by (rewrite kvs_from_length; lia).
    rewrite firstn_all2; [reflexivity |].
    rewrite app_length, kvs_from_length. simpl. lia.
  Qed.

  (* The cache a sequence xs leaves: layer l's K and V rows, as naive decode computes them. *)
  Definition cache_of (xs : list X) : nat -> list (K * V) := fun l => kvs_from l 0 (hidden l xs).

  Lemma hidden_snoc : same_fold_order -> forall n xs x,
    hidden n (xs ++ [x]) = hidden n xs ++ [cached_row n (cache_of xs) (length xs) x].
  Proof.
    intros Hsame. induction n as [| n IH]; intros xs x; simpl; auto.
    rewrite IH, layer_naive_snoc, hidden_length, Hsame. reflexivity.
  Qed.

  (* The theorem: the cached row at position T-1 equals naive decode's row T-1. *)
  Theorem cached_row_equals_naive : same_fold_order -> forall n toks tok,
    last (hidden n (map embed (toks ++ [tok]))) (embed tok) =
      cached_row n (cache_of (map embed toks)) (length toks) (embed tok).
  Proof.
    intros Hsame n toks tok.
    rewrite map_app. simpl. rewrite hidden_snoc by exact Hsame.
    rewrite last_last, map_length. reflexivity.
  Qed.

  (* And the step leaves the cache naive decode computes for the longer sequence: each layer's
     rows plus the new row's K and V. So the next step starts from the same situation. *)
  Theorem cache_after_step : same_fold_order -> forall l toks tok,
    cache_of (map embed (toks ++ [tok])) l =
      cache_of (map embed toks) l ++
        [kv_of l (length toks) (cached_row l (cache_of (map embed toks)) (length toks) (embed tok))].
  Proof.
    intros Hsame l toks tok. unfold cache_of at 1.
    rewrite map_app. simpl. rewrite hidden_snoc by exact Hsame.
    rewrite kvs_from_app, hidden_length, map_length. reflexivity.
  Qed.
End CausalReuse.
