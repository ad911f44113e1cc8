(* The memory formulas of `kvlab memory`, the viewer and core/memory_model.h, proven.

   A cache holds K and V (2 tensors) of bytes_per_scalar each, per layer, per position, per KV
   head, per element of a head:
     contiguous T                = 2 * b * n_layers * T * n_kv_heads * head_size
     paged T (block_size bs > 0) = the same with T rounded up to whole blocks
   and grouped-query attention divides the contiguous cache of multi-head attention by
   n_heads / n_kv_heads. *)
(* main: paged_bounds gqa_saving paged_exact_on_block_multiples *)

From Coq Require Import Arith Lia.

Definition contiguous (b n_layers n_kv_heads head_size T : nat) : nat :=
  2 * b * n_layers * T * n_kv_heads * head_size.

(* Whole blocks of bs positions holding T: ceil(T / bs). *)
Definition blocks (bs T : nat) : nat := (T + bs - 1) / bs.

Definition paged (b n_layers n_kv_heads head_size bs T : nat) : nat :=
  contiguous b n_layers n_kv_heads head_size (blocks bs T * bs).

(* ceil(T / bs) blocks hold T positions, and waste less than one block. *)
Lemma blocks_bounds : forall bs T, 0 < bs -> T <= blocks bs T * bs < T + bs.
Proof.
  intros bs T Hbs. unfold blocks.
  pose proof (Nat.div_mod (T + bs - 1) bs ltac:(lia)) as Hdm.
  pose proof (Nat.mod_upper_bound (T + bs - 1) bs ltac:(lia)) as Hmod.
  split; nia.
Qed.

(* A paged cache holds at least the contiguous bytes of T positions, and less than one block
   more: the waste of paging is under one block per sequence. *)
Theorem paged_bounds : forall b L nkv hs bs T,
  0 < bs -> 0 < contiguous b L nkv hs 1 ->
  contiguous b L nkv hs T <= paged b L nkv hs bs T < contiguous b L nkv hs T + contiguous b L nkv hs bs.
Proof.
  intros b L nkv hs bs T Hbs Hpos.
  unfold paged, contiguous in *.
  pose proof (blocks_bounds bs T Hbs) as [Hlo Hhi].
  set (c := 2 * b * L) in *.
  assert (Hc : 0 < c * nkv * hs) by nia.
  split; nia.
Qed.

(* On a whole number of blocks, paging wastes nothing. *)
Theorem paged_exact_on_block_multiples : forall b L nkv hs bs k, 0 < bs ->
  paged b L nkv hs bs (k * bs) = contiguous b L nkv hs (k * bs).
Proof.
  intros b L nkv hs bs k Hbs. unfold paged, blocks.
  replace (k * bs + bs - 1) with ((bs - 1) + k * bs) by lia.
  rewrite Nat.div_add by lia.
  rewrite Nat.div_small by lia. reflexivity.
Qed.

(* GQA: with n_kv_heads dividing n_heads, the multi-head cache is n_heads / n_kv_heads times
   the grouped one; MQA is the case n_kv_heads = 1. *)
Theorem gqa_saving : forall b L hs T n_heads n_kv_heads g,
  n_heads = g * n_kv_heads ->
  contiguous b L n_heads hs T = g * contiguous b L n_kv_heads hs T.
Proof.
  intros b L hs T n_heads n_kv_heads g ->. unfold contiguous. nia.
Qed.
